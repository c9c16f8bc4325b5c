//! The agent's local debug API: a unix socket streaming every connection event as a JSON line, so
//! `network-enforcer-agent flows` (run with `kubectl exec` in the agent's pod) shows what the running agent
//! sees instead of loading a second copy of the programs.
//!
//! The client writes one [`Request`] line first. With `since_ns`, the agent answers with the edges of its
//! recent-records buffer ([`RecentEdges`]) whose last_seen is within that window (`{"edge": ...}` lines,
//! then `{"history_end": ...}`), then streams live events (`{"event": ...}`). A slow client never slows
//! the agent: each client has a bounded queue, and when it falls behind the lines it missed are dropped
//! and counted in a `{"lagged": N}` line.
//!
//! The recent-records buffer holds at most [`RECENT_EDGES`] edges (about 200 bytes each); when full, the
//! edges seen longest ago are evicted, and a `--since` reaching back before the newest evicted edge is
//! answered with `incomplete: true`.

use crate::aggregate::{EdgeHasher, EdgeId, EdgeKey, EdgeStats};
use crate::debug::flows::{PodNames, direction_name, outcome_name, protocol_name};
use crate::debug::peers::SharedPeers;
use crate::error::{Error, Result};
use crate::kernel::events::{ConnectionEvent, Direction, Outcome, Protocol};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::broadcast;

/// Where the agent listens by default (inside the agent's pod; `kubectl exec` reaches it there).
pub const DEFAULT_SOCKET: &str = "/run/network-enforcer/agent.sock";

/// Lines a client may fall behind before it starts missing some.
const CLIENT_QUEUE: usize = 16_384;

/// Edges the recent-records buffer holds at most.
pub const RECENT_EDGES: usize = 16_384;

/// How long the agent waits for a client's request line before streaming live events only.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// The most a request line may weigh: a request is a few dozen bytes, and a client must not make the
/// agent buffer an endless line.
const MAX_REQUEST_BYTES: u64 = 4096;

/// How long a write to a client may take: one that stopped reading (a paused pager, a suspended
/// process) is let go rather than kept, with what it asked for, for ever.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a client asks for (its first line).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Replay the recent edges last seen at most this many nanoseconds ago before the live events.
    pub since_ns: Option<u64>,
    /// Name the process of each outbound TCP connection in the live events (`pid`). The kernel
    /// notes it only while a connected client asks: it is about a fifth of the agent's kernel time
    /// per connection (docs/design.md, "Capture"), and `flows` does not show it.
    #[serde(default)]
    pub pids: bool,
}

/// One line from the agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Line {
    /// A live event.
    Event(EventRecord),
    /// An edge of the recent-records buffer (answering `since_ns`).
    Edge(EdgeRecord),
    /// The last [`Line::Edge`]; `incomplete` when edges of the window were evicted.
    HistoryEnd {
        /// Edges last seen within the window were evicted from the bounded buffer.
        incomplete: bool,
    },
    /// This many lines were dropped because the client fell behind.
    Lagged(u64),
}

/// One aggregated edge on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeRecord {
    /// The edge as an event (`monotonic_ns` is the last time it was seen; `count` is 1).
    #[serde(flatten)]
    pub edge: EventRecord,
    /// Kernel time of the first occurrence held.
    pub first_seen_ns: u64,
    /// Occurrences.
    pub total: u64,
}

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
    /// The process that opened the connection: UDP always, an outbound TCP connection only when it
    /// was made while a client that asked for processes ([`Request::pids`]) was connected.
    pub pid: Option<u32>,
    /// The socket error of a failed attempt.
    pub error: Option<u8>,
    /// Occurrences this event stands for.
    pub count: u32,
    /// The local pod: `namespace/name`, or `uid:<UID>` without the pod watch; absent for the host and
    /// unknown namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The peer's name (`svc <ns>/<name>`, `<ns>/<name>`, `node/<name>`; [`crate::debug::peers`]);
    /// absent when no watched object has the address. `remote` keeps the address either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
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
            pod: None,
            peer: None,
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl EdgeRecord {
    /// An edge of the buffer on the wire.
    pub fn new(key: &EdgeKey, stats: &EdgeStats, pod: Option<&str>) -> Self {
        let local_port = match key.direction {
            Direction::Inbound => key.port,
            Direction::Outbound => 0,
        };
        let remote_port = match key.direction {
            Direction::Outbound => key.port,
            Direction::Inbound => 0,
        };
        Self {
            edge: EventRecord {
                monotonic_ns: nanos(stats.last_seen),
                protocol: protocol_name(key.protocol).into(),
                direction: direction_name(key.direction).into(),
                outcome: outcome_name(key.outcome).into(),
                local: SocketAddr::new(key.local_ip, local_port),
                remote: SocketAddr::new(key.peer_ip, remote_port),
                netns_ino: key.netns_ino,
                cgroup_id: key.cgroup_id,
                pid: None,
                error: stats.last_error,
                count: 1,
                pod: pod.map(str::to_string),
                peer: None,
            },
            first_seen_ns: nanos(stats.first_seen),
            total: stats.count,
        }
    }

    /// Back to the edge; fails on a field value this build does not know.
    pub fn into_edge(self) -> Result<(EdgeKey, EdgeStats, Option<String>), String> {
        let (first, total) = (self.first_seen_ns, self.total);
        let pod = self.edge.pod.clone();
        let event = ConnectionEvent::try_from(self.edge)?;
        let stats = EdgeStats {
            first_seen: Duration::from_nanos(first),
            last_seen: event.monotonic,
            count: total,
            last_error: event.error,
        };
        Ok((EdgeKey::of(&event), stats, pod))
    }
}

struct Recent {
    key: EdgeKey,
    stats: EdgeStats,
    pod: Option<Arc<str>>,
    peer: Option<Arc<str>>,
}

/// The recent-records buffer: every edge seen lately, aggregated, with its pod label; bounded to a
/// capacity (the edges seen longest ago are evicted first).
pub struct RecentEdges {
    edges: HashMap<EdgeId, Recent, EdgeHasher>,
    capacity: usize,
    /// The newest last_seen of any evicted edge: a window reaching back before it is incomplete.
    evicted_until: Option<Duration>,
    evicted: u64,
}

impl RecentEdges {
    /// An empty buffer for at most `capacity` edges.
    pub fn new(capacity: usize) -> Self {
        Self {
            edges: HashMap::default(),
            capacity: capacity.max(1),
            evicted_until: None,
            evicted: 0,
        }
    }

    /// Adds an event to its edge and returns the edge's pod label. `pod` is asked when the edge is new
    /// or not yet named (a pod's namespace may be found by a later scan).
    pub fn add(
        &mut self,
        event: &ConnectionEvent,
        pod: impl FnOnce() -> Option<Arc<str>>,
    ) -> Option<Arc<str>> {
        self.add_named(event, pod, || None).0
    }

    /// [`RecentEdges::add`], also naming the peer: returns the edge's (pod label, peer name). `peer` is
    /// asked like `pod`, when the edge is new or its peer not yet named (a watch may learn it later).
    pub fn add_named(
        &mut self,
        event: &ConnectionEvent,
        pod: impl FnOnce() -> Option<Arc<str>>,
        peer: impl FnOnce() -> Option<Arc<str>>,
    ) -> (Option<Arc<str>>, Option<Arc<str>>) {
        let key = EdgeKey::of(event);
        let id = EdgeId::of(&key);
        let stats = EdgeStats {
            first_seen: event.monotonic,
            last_seen: event.monotonic,
            count: u64::from(event.count.max(1)),
            last_error: event.error,
        };
        if let Some(recent) = self.edges.get_mut(&id) {
            recent.stats.merge(&stats);
            if recent.pod.is_none() {
                recent.pod = pod();
            }
            if recent.peer.is_none() {
                recent.peer = peer();
            }
            return (recent.pod.clone(), recent.peer.clone());
        }
        if self.edges.len() >= self.capacity {
            self.evict();
        }
        let (pod, peer) = (pod(), peer());
        self.edges.insert(
            id,
            Recent {
                key,
                stats,
                pod: pod.clone(),
                peer: peer.clone(),
            },
        );
        (pod, peer)
    }

    /// Drops the oldest eighth (at least one edge), so eviction costs O(log n) per insert amortized.
    fn evict(&mut self) {
        let mut seen: Vec<Duration> = self.edges.values().map(|r| r.stats.last_seen).collect();
        let drop = (self.capacity / 8).max(1).min(seen.len());
        let (_, cutoff, _) = seen.select_nth_unstable(drop - 1);
        let cutoff = *cutoff;
        let before = self.edges.len();
        self.edges.retain(|_, r| r.stats.last_seen > cutoff);
        self.evicted += (before - self.edges.len()) as u64;
        self.evicted_until = Some(self.evicted_until.map_or(cutoff, |t| t.max(cutoff)));
    }

    /// The edges last seen at or after `from`, oldest first, and whether the answer is complete.
    pub fn since(&self, from: Duration) -> (Vec<EdgeRecord>, bool) {
        let mut out: Vec<&Recent> = self
            .edges
            .values()
            .filter(|r| r.stats.last_seen >= from)
            .collect();
        out.sort_by_key(|r| (r.stats.first_seen, r.key));
        let records = out
            .into_iter()
            .map(|r| {
                let mut record = EdgeRecord::new(&r.key, &r.stats, r.pod.as_deref());
                record.edge.peer = r.peer.as_deref().map(str::to_string);
                record
            })
            .collect();
        (records, self.evicted_until.is_none_or(|t| t < from))
    }

    /// Edges held.
    pub fn len(&self) -> usize {
        self.edges.len()
    }

    /// Whether no edge is held.
    pub fn is_empty(&self) -> bool {
        self.edges.is_empty()
    }

    /// Edges evicted so far.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }
}

impl TryFrom<EventRecord> for ConnectionEvent {
    type Error = String;

    fn try_from(r: EventRecord) -> Result<Self, String> {
        let protocol = match network_enforcer_api::Protocol::from_lowercase(&r.protocol) {
            Some(network_enforcer_api::Protocol::TCP) => Protocol::Tcp,
            Some(network_enforcer_api::Protocol::UDP) => Protocol::Udp,
            _ => return Err(format!("unknown protocol {:?}", r.protocol)),
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
    shared: Arc<Shared>,
    path: PathBuf,
}

struct Shared {
    /// Held while publishing, and while a new client takes its history and subscribes: a clean cut, so
    /// no event is both in a client's history and in its live stream.
    recent: Mutex<RecentEdges>,
    lines: broadcast::Sender<Arc<str>>,
    /// Names of peer addresses, when the agent watches the cluster ([`DebugServer::with_peers`]).
    peers: OnceLock<SharedPeers>,
    /// Clients asking for processes connected now; told to [`DebugServer::on_watchers`]'s function as it changes
    /// between none and some, under this lock (so two clients coming and going cannot reorder it).
    watchers: Mutex<usize>,
    on_watchers: OnceLock<Box<dyn Fn(bool) + Send + Sync>>,
}

/// A connected client that asked for processes ([`Request::pids`]), counted in
/// [`Shared::watchers`] while it lives.
struct Watching(Arc<Shared>);

impl Watching {
    fn start(shared: Arc<Shared>) -> Self {
        // Made first, so that its drop undoes the count whatever happens after.
        let watching = Self(shared);
        let mut watchers = watching
            .0
            .watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *watchers += 1;
        if *watchers == 1
            && let Some(tell) = watching.0.on_watchers.get()
        {
            tell(true);
        }
        drop(watchers);
        watching
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let mut watchers = self.0.watchers.lock().unwrap_or_else(|p| p.into_inner());
        *watchers = watchers.saturating_sub(1);
        if *watchers == 0
            && let Some(tell) = self.0.on_watchers.get()
        {
            tell(false);
        }
    }
}

impl Shared {
    fn recent(&self) -> std::sync::MutexGuard<'_, RecentEdges> {
        // Nothing panics while holding it; if something did, the buffer is still consistent enough.
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub use crate::pipeline::Attributed;

impl crate::pipeline::EventTap for DebugServer {
    fn publish(
        &self,
        events: &[ConnectionEvent],
        attribute: &mut dyn FnMut(&ConnectionEvent) -> Attributed,
    ) {
        DebugServer::publish(self, events, attribute);
    }
}

impl DebugServer {
    /// Listens on `path` (its directory is created; a stale socket file from a previous run is replaced),
    /// keeping at most `recent_edges` edges for `since` requests.
    pub fn bind(path: &Path, recent_edges: usize) -> Result<Self> {
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
        let shared = Arc::new(Shared {
            recent: Mutex::new(RecentEdges::new(recent_edges)),
            lines,
            peers: OnceLock::new(),
            watchers: Mutex::new(0),
            on_watchers: OnceLock::new(),
        });
        let server = Self {
            shared: shared.clone(),
            path: path.to_path_buf(),
        };
        tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        tokio::spawn(serve_client(stream, shared.clone()));
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

    /// Names peers from `peers` from now on (set once; a later call is ignored).
    pub fn with_peers(self, peers: SharedPeers) -> Self {
        let _ = self.shared.peers.set(peers);
        self
    }

    /// Calls `tell(true)` when a first client asking for processes ([`Request::pids`]) connects and
    /// `tell(false)` when the last one leaves (set once; a later call is ignored): the agent names
    /// the processes of TCP connections only while someone asks.
    pub fn on_watchers(self, tell: impl Fn(bool) + Send + Sync + 'static) -> Self {
        // Under the count's lock: a client that came between `bind` and now is told about too.
        let watchers = self
            .shared
            .watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if self.shared.on_watchers.set(Box::new(tell)).is_ok()
            && *watchers > 0
            && let Some(tell) = self.shared.on_watchers.get()
        {
            tell(true);
        }
        drop(watchers);
        self
    }

    /// Adds events to the recent-records buffer and sends them to every connected client. `pod` names
    /// an event's local pod, the peer directory (if any) its peer; both are asked once per new (or
    /// still unnamed) edge, not per event.
    pub fn publish(
        &self,
        events: &[ConnectionEvent],
        pod: impl FnMut(&ConnectionEvent) -> Attributed,
    ) {
        let mut recent = self.shared.recent();
        let live = self.shared.lines.receiver_count() > 0;
        let pod = std::cell::RefCell::new(pod);
        for event in events {
            // One attribution per event at most, shared by the pod's label and the peer's DNS name.
            let attributed = std::cell::OnceCell::new();
            let attribute = || attributed.get_or_init(|| (pod.borrow_mut())(event));
            let peer = || {
                let named = self.shared.peers.get().and_then(|peers| {
                    // A poisoned lock means a panic elsewhere already; the names are still usable.
                    let peers = peers.lock().unwrap_or_else(|p| p.into_inner());
                    peers.name(event.remote.ip())
                });
                named.or_else(|| attribute().resolved_from.clone())
            };
            let (label, peer) = recent.add_named(event, || attribute().pod.clone(), peer);
            if live {
                let mut record = EventRecord::from(event);
                record.pod = label.map(|l| l.to_string());
                record.peer = peer.map(|l| l.to_string());
                if let Ok(line) = serde_json::to_string(&Line::Event(record)) {
                    let _ = self.shared.lines.send(line.into());
                }
            }
        }
    }

    /// Edges in the recent-records buffer and how many were evicted so far.
    pub fn recent_edges(&self) -> (usize, u64) {
        let recent = self.shared.recent();
        (recent.len(), recent.evicted())
    }
}

impl Drop for DebugServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

async fn serve_client(stream: UnixStream, shared: Arc<Shared>) {
    let (read, mut write) = stream.into_split();
    // Past the bound the line reads as cut short, fails to parse, and the client gets live events.
    let mut requests = BufReader::new(read.take(MAX_REQUEST_BYTES)).lines();
    let request = match tokio::time::timeout(REQUEST_TIMEOUT, requests.next_line()).await {
        Ok(Ok(Some(line))) => serde_json::from_str::<Request>(&line).unwrap_or_else(|err| {
            tracing::warn!(%err, "debug socket: unreadable request; streaming live events only");
            Request::default()
        }),
        // No request: a client that only listens.
        _ => Request::default(),
    };
    // From here on: the history takes a moment, and the live events after it should name their
    // processes already.
    let _watching = request.pids.then(|| Watching::start(shared.clone()));
    let (history, mut lines) = {
        let recent = shared.recent();
        let history = request.since_ns.map(|ns| {
            let from = crate::clock::monotonic_now().saturating_sub(Duration::from_nanos(ns));
            recent.since(from)
        });
        (history, shared.lines.subscribe())
    };
    let mut out: Vec<Line> = Vec::new();
    if let Some((records, complete)) = history {
        out.extend(records.into_iter().map(Line::Edge));
        out.push(Line::HistoryEnd {
            incomplete: !complete,
        });
    }
    for line in out {
        let Ok(text) = serde_json::to_string(&line) else {
            continue;
        };
        if !written(&mut write, &text).await {
            return;
        }
    }
    // The connection itself, past the request's bound: a client that closed its end is gone even
    // while no event comes to fail a write (what it sends after the request is not read as asked).
    let mut read = requests.into_inner().into_inner().into_inner();
    let mut discarded = [0u8; 512];
    loop {
        let received = tokio::select! {
            received = lines.recv() => received,
            read = read.read(&mut discarded) => match read {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            },
        };
        let line = match received {
            Ok(line) => line,
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                serde_json::to_string(&Line::Lagged(missed))
                    .unwrap_or_default()
                    .into()
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if !written(&mut write, &line).await {
            return;
        }
    }
}

/// Writes `line` within [`WRITE_TIMEOUT`]; `false`: the client went away or stopped reading.
async fn written(write: &mut tokio::net::unix::OwnedWriteHalf, line: &str) -> bool {
    matches!(
        tokio::time::timeout(WRITE_TIMEOUT, write_line(write, line)).await,
        Ok(Ok(()))
    )
}

async fn write_line(
    write: &mut tokio::net::unix::OwnedWriteHalf,
    line: &str,
) -> std::io::Result<()> {
    write.write_all(line.as_bytes()).await?;
    write.write_all(b"\n").await
}

/// The history a client asked for: edges (with pod labels) and whether the buffer still held all of
/// the window.
pub struct History {
    /// The edges last seen within the window.
    pub edges: Vec<(EdgeKey, EdgeStats)>,
    /// False when the agent's bounded buffer had evicted edges of the window.
    pub complete: bool,
}

/// The client side, used by `flows`.
pub struct DebugClient {
    lines: tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
    _write: tokio::net::unix::OwnedWriteHalf,
    lagged: u64,
    names: PodNames,
}

impl DebugClient {
    /// Connects to a running agent; with `since`, the agent first replays the edges last seen within
    /// that window (read them with [`DebugClient::read_history`]).
    pub async fn connect(path: &Path, since: Option<Duration>) -> Result<Self> {
        let request = Request {
            since_ns: since.map(nanos),
            pids: false,
        };
        Self::asking(path, &request).await
    }

    /// Connects to the agent's debug socket with `request` as the first line.
    pub async fn asking(path: &Path, request: &Request) -> Result<Self> {
        let io = |source| Error::DebugSocket {
            path: path.to_path_buf(),
            source,
        };
        let stream = UnixStream::connect(path).await.map_err(io)?;
        let (read, mut write) = stream.into_split();
        let text = serde_json::to_string(&request).unwrap_or_default();
        write_line(&mut write, &text).await.map_err(io)?;
        Ok(Self {
            lines: BufReader::new(read).lines(),
            _write: write,
            lagged: 0,
            names: PodNames::default(),
        })
    }

    async fn next_line(&mut self) -> Result<Line> {
        loop {
            let text = self
                .lines
                .next_line()
                .await
                .map_err(Error::Poll)?
                .ok_or_else(|| Error::Poll(std::io::ErrorKind::UnexpectedEof.into()))?;
            match serde_json::from_str::<Line>(&text) {
                Ok(Line::Lagged(missed)) => self.lagged = self.lagged.saturating_add(missed),
                Ok(line) => return Ok(line),
                Err(err) => tracing::warn!(%err, "debug socket: skipping a line"),
            }
        }
    }

    /// Reads the replayed edges up to the end of the history (after `connect` with `since`).
    pub async fn read_history(&mut self) -> Result<History> {
        let mut edges = Vec::new();
        loop {
            match self.next_line().await? {
                Line::Edge(mut record) => match (record.edge.peer.take(), record.into_edge()) {
                    (peer, Ok((key, stats, pod))) => {
                        if let Some(pod) = pod {
                            self.names.insert(&key, pod.into());
                        }
                        if let Some(peer) = peer {
                            self.names.insert_peer(key.peer_ip, peer.into());
                        }
                        edges.push((key, stats));
                    }
                    (_, Err(err)) => tracing::warn!(%err, "debug socket: skipping an edge"),
                },
                Line::HistoryEnd { incomplete } => {
                    return Ok(History {
                        edges,
                        complete: !incomplete,
                    });
                }
                Line::Event(_) | Line::Lagged(_) => {}
            }
        }
    }

    /// Waits for the next event and appends it to `out`. Fails when the agent closes the connection.
    pub async fn read_batch(&mut self, out: &mut Vec<ConnectionEvent>) -> Result<()> {
        loop {
            let Line::Event(mut record) = self.next_line().await? else {
                continue;
            };
            let pod = record.pod.take();
            let peer = record.peer.take();
            match ConnectionEvent::try_from(record) {
                Ok(event) => {
                    if let Some(pod) = pod {
                        self.names.insert(&EdgeKey::of(&event), pod.into());
                    }
                    if let Some(peer) = peer {
                        self.names.insert_peer(event.remote.ip(), peer.into());
                    }
                    out.push(event);
                    return Ok(());
                }
                Err(err) => tracing::warn!(%err, "debug socket: skipping an event"),
            }
        }
    }

    /// Events the agent dropped for this client because it fell behind.
    pub fn lagged(&self) -> u64 {
        self.lagged
    }

    /// The pod labels and peer names the agent sent so far.
    pub fn names(&self) -> &PodNames {
        &self.names
    }

    /// The names, to add what the client knows itself (the host's namespace, [`PodNames::set_host`]).
    pub fn names_mut(&mut self) -> &mut PodNames {
        &mut self.names
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

    fn at(event: ConnectionEvent, secs: u64, remote_port: u16) -> ConnectionEvent {
        ConnectionEvent {
            monotonic: Duration::from_secs(secs),
            remote: SocketAddr::new(event.remote.ip(), remote_port),
            ..event
        }
    }

    #[test]
    fn recent_edges_aggregate_name_once_and_answer_a_window() {
        let mut recent = RecentEdges::new(100);
        let mut asked = 0;
        for (secs, port) in [(10, 1), (20, 2), (30, 3)] {
            // Inbound: the remote port is ephemeral, so these are one edge.
            let label = recent.add(&at(event(), secs, 40_000 + port), || {
                asked += 1;
                Some("shop/dns".into())
            });
            assert_eq!(label.as_deref(), Some("shop/dns"));
        }
        assert_eq!(asked, 1, "the label is asked once per edge");
        assert_eq!(recent.len(), 1);
        let (records, complete) = recent.since(Duration::from_secs(25));
        assert!(complete);
        assert_eq!(records.len(), 1);
        let (key, stats, pod) = records[0].clone().into_edge().unwrap();
        assert_eq!(key, EdgeKey::of(&event()));
        assert_eq!(
            (stats.first_seen, stats.last_seen, stats.count),
            (Duration::from_secs(10), Duration::from_secs(30), 6)
        );
        assert_eq!(pod.as_deref(), Some("shop/dns"));
        assert!(recent.since(Duration::from_secs(31)).0.is_empty());
    }

    #[test]
    fn an_unnamed_edge_is_asked_again_later() {
        let mut recent = RecentEdges::new(100);
        assert_eq!(recent.add(&event(), || None), None);
        assert_eq!(
            recent.add(&event(), || Some("shop/new".into())).as_deref(),
            Some("shop/new")
        );
    }

    #[test]
    fn recent_edges_are_bounded_and_say_when_a_window_is_incomplete() {
        let mut recent = RecentEdges::new(16);
        for i in 0..40u64 {
            let mut e = at(event(), i, 1);
            e.local = SocketAddr::new(e.local.ip(), 1000 + i as u16); // a new edge each time
            recent.add(&e, || None);
        }
        assert!(recent.len() <= 16, "{}", recent.len());
        assert!(recent.evicted() >= 24);
        let (records, complete) = recent.since(Duration::ZERO);
        assert!(!complete, "old edges were evicted");
        assert_eq!(records.len(), recent.len());
        let (newest, complete) = recent.since(Duration::from_secs(38));
        assert!(complete, "the newest edges are all there");
        assert_eq!(newest.len(), 2);
    }

    #[test]
    fn records_round_trip_through_json() {
        let line = serde_json::to_string(&Line::Event(EventRecord::from(&event()))).unwrap();
        let Line::Event(record) = serde_json::from_str(&line).unwrap() else {
            panic!("{line}")
        };
        assert_eq!(ConnectionEvent::try_from(record), Ok(event()));
    }

    /// Whatever answers on the socket, the client's loss counter saturates instead of overflowing.
    #[tokio::test]
    async fn lagged_counts_from_the_socket_saturate() {
        let dir = std::env::temp_dir().join(format!("ne-debug-lagged-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("agent.sock");
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let event_line = serde_json::to_string(&Line::Event(EventRecord::from(&event()))).unwrap();
        let lagged_line = serde_json::to_string(&Line::Lagged(u64::MAX)).unwrap();
        let peer = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let text = format!("{lagged_line}\n{lagged_line}\n{event_line}\n");
            tokio::io::AsyncWriteExt::write_all(&mut stream, text.as_bytes())
                .await
                .unwrap();
            stream
        });
        let mut client = DebugClient::connect(&path, None).await.unwrap();
        let mut got = Vec::new();
        client.read_batch(&mut got).await.unwrap();
        assert_eq!(got, vec![event()]);
        assert_eq!(client.lagged(), u64::MAX);
        drop(peer.await.unwrap());
        let _ = std::fs::remove_dir_all(dir);
    }

    /// An outside address has no name in the directory: the `flows` view names it by what its pod
    /// resolved it from.
    #[tokio::test]
    async fn an_outside_peer_is_named_by_the_name_its_pod_resolved_it_from() {
        let dir = std::env::temp_dir().join(format!("ne-debug-dns-{}", std::process::id()));
        let path = dir.join("agent.sock");
        let server = DebugServer::bind(&path, 100).unwrap();
        let recent = ConnectionEvent {
            monotonic: crate::clock::monotonic_now(),
            ..event()
        };
        let mut asked = 0;
        server.publish(&[recent, recent], |_| {
            asked += 1;
            Attributed {
                pod: Some("shop/web".into()),
                resolved_from: Some("api.partner.test".into()),
            }
        });
        assert_eq!(
            asked, 1,
            "attributed once per new edge, for its pod and its peer"
        );
        let mut client = DebugClient::connect(&path, Some(Duration::from_secs(60)))
            .await
            .unwrap();
        let history = client.read_history().await.unwrap();
        let key = &history.edges[0].0;
        assert_eq!(client.names().get(key), Some("shop/web"));
        assert_eq!(client.names().peer(key), Some("api.partner.test"));
        drop(server);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// The agent names the peer from its directory, in the replayed history and in live events; the
    /// client keeps the name by address.
    #[tokio::test]
    async fn clients_receive_peer_names_in_history_and_live() {
        use crate::debug::peers::{PeerDirectory, PeerKind};
        let dir = std::env::temp_dir().join(format!("ne-debug-peers-{}", std::process::id()));
        let path = dir.join("agent.sock");
        let peers = SharedPeers::default();
        let server = DebugServer::bind(&path, 100)
            .unwrap()
            .with_peers(peers.clone());
        let remote = event().remote.ip();
        let named = |p: &SharedPeers, label: &str| {
            let mut d = PeerDirectory::new(10);
            d.apply(PeerKind::Pod, label.into(), vec![remote]);
            *p.lock().unwrap() = d;
        };
        named(&peers, "shop/client-1");
        let recent = ConnectionEvent {
            monotonic: crate::clock::monotonic_now(),
            ..event()
        };
        server.publish(&[recent], |_| Attributed::default());
        let mut client = DebugClient::connect(&path, Some(Duration::from_secs(60)))
            .await
            .unwrap();
        let history = client.read_history().await.unwrap();
        assert_eq!(
            client.names().peer(&history.edges[0].0),
            Some("shop/client-1")
        );
        // A live event of another edge is named when it is published.
        named(&peers, "svc shop/dns");
        let mut other = event();
        other.local = SocketAddr::new(other.local.ip(), 54);
        let mut got = Vec::new();
        let read = async {
            client.read_batch(&mut got).await.unwrap();
        };
        let publish = async {
            loop {
                server.publish(&[other], |_| Attributed::default());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::select! {
            () = read => {}
            () = publish => unreachable!(),
            () = tokio::time::sleep(Duration::from_secs(5)) => panic!("no event within 5 s"),
        }
        assert_eq!(
            client.names().peer(&EdgeKey::of(&got[0])),
            Some("svc shop/dns")
        );
        drop(server);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn clients_receive_history_then_published_events_with_pod_labels() {
        let dir = std::env::temp_dir().join(format!("ne-debug-{}", std::process::id()));
        let path = dir.join("agent.sock");
        let server = DebugServer::bind(&path, 100).unwrap();
        let now = crate::clock::monotonic_now();
        let old = ConnectionEvent {
            monotonic: now.saturating_sub(Duration::from_secs(3600)),
            ..at(event(), 0, 1)
        };
        let mut recent = ConnectionEvent {
            monotonic: now,
            ..event()
        };
        recent.local = SocketAddr::new(recent.local.ip(), 54);
        server.publish(&[old, recent], |_| Attributed {
            pod: Some("shop/dns".into()),
            resolved_from: None,
        });
        let mut client = DebugClient::connect(&path, Some(Duration::from_secs(60)))
            .await
            .unwrap();
        let history = client.read_history().await.unwrap();
        assert!(history.complete);
        assert_eq!(history.edges.len(), 1, "only the edge seen within a minute");
        assert_eq!(history.edges[0].0, EdgeKey::of(&recent));
        assert_eq!(client.names().get(&history.edges[0].0), Some("shop/dns"));
        // The live stream follows.
        let mut got = Vec::new();
        let read = async {
            client.read_batch(&mut got).await.unwrap();
        };
        let publish = async {
            loop {
                server.publish(&[event()], |_| Attributed::default());
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

    #[tokio::test]
    async fn the_first_client_turns_watching_on_and_the_last_one_off() {
        let dir = std::env::temp_dir().join(format!("ne-debug-watch-{}", std::process::id()));
        let path = dir.join("agent.sock");
        let told = Arc::new(Mutex::new(Vec::new()));
        let server = DebugServer::bind(&path, 100).unwrap().on_watchers({
            let told = told.clone();
            move |watched| told.lock().unwrap().push(watched)
        });
        let told_now = || told.lock().unwrap().clone();
        let until = |want: Vec<bool>| async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while told_now() != want {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "told {:?}, want {want:?}",
                    told_now()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        // A client that does not ask for processes turns nothing on.
        let _listening = DebugClient::connect(&path, None).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(told_now(), Vec::<bool>::new());
        let asking = Request {
            since_ns: None,
            pids: true,
        };
        let first = DebugClient::asking(&path, &asking).await.unwrap();
        until(vec![true]).await;
        let second = DebugClient::asking(&path, &asking).await.unwrap();
        // Its connection is served once accepted: wait until it is counted.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while *server.shared.watchers.lock().unwrap() != 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "second client never counted"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(first);
        // One of two left: still watched, nothing told.
        for _ in 0..20 {
            server.publish(&[event()], |_| Attributed::default());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(told_now(), vec![true]);
        drop(second);
        // Seen gone by its closed end, with no event published to fail a write.
        until(vec![true, false]).await;
        let _third = DebugClient::asking(&path, &asking).await.unwrap();
        until(vec![true, false, true]).await;
        drop(server);
        let _ = std::fs::remove_dir(dir);
    }
}
