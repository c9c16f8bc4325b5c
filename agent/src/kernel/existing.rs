//! Connections that existed before the agent started.
//!
//! The live programs see a TCP connection at its handshake and a connected UDP socket at `connect()`;
//! a database pool or a gRPC stream opened before the agent (install, upgrade, restart) shows neither.
//! So at start, once the live programs are attached, the agent walks every socket on the node once with
//! a BPF iterator (`iter/task_file`, `agent-ebpf/src/scan.rs`; why that one: docs/design.md, "Connections
//! open before the agent") and turns each established TCP connection and each connected UDP socket into
//! the [`ConnectionEvent`] the live path would have produced for it. The events go through the same
//! pipeline ([`crate::pipeline::Pipeline::take_in`]): attributed by the socket's own network namespace and
//! cgroup, aggregated, flushed and sent like live ones, so a connection seen by both is one edge.
//!
//! Direction comes from the sockets, never from port numbers: a TCP socket in ESTABLISHED whose local
//! port is also a LISTEN port in the same network namespace is the server side (inbound), any other is
//! the client (outbound). A connected UDP socket is the client (the live path reports `connect()` as
//! outbound), unless an unconnected socket of the same namespace is bound to its local port (a server
//! that connects a socket per peer, as QUIC servers do): then it is inbound. Bound but unconnected UDP
//! sockets have no peer and make no edge; their next `sendto`/`recvfrom` is seen live.
//!
//! Bounded: at most `max_sockets` connection records and as many listening ports are kept (56 bytes
//! each); connections past the cap are counted and dropped. Past the listener cap the scan gives up:
//! without every listener the direction of a connection could be wrong, and the agent does not guess.
//! It runs once, on a blocking thread; a failure is logged as a warning and the agent goes on.

use crate::clock::monotonic_now;
use crate::kernel::btf::{Btf, BtfError};
use crate::kernel::events::{ConnectionEvent, Direction, Outcome};
use aya::EbpfLoader;
use aya::programs::Iter;
use network_enforcer_agent_common::scan::{
    SCAN_CONFIG_GLOBAL, SCAN_PROGRAM, ScanOffsets, SocketRecord, TCP_ESTABLISHED, TCP_LISTEN,
};
use network_enforcer_agent_common::{FlowEvent, IPPROTO_TCP, IPPROTO_UDP, KernelOffsets};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use std::collections::HashSet;
use std::io::Read;
use std::time::{Duration, Instant};

/// The scan program, compiled by `build.rs` from `agent-ebpf/src/scan.rs`.
static SCAN_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(
    env!("OUT_DIR"),
    "/network-enforcer-agent-ebpf-scan"
));

/// Connection records kept by default (about 3.5 MiB at most): far above a node's open connections.
pub const DEFAULT_MAX_SOCKETS: usize = 65_536;

const RECORD_SIZE: usize = std::mem::size_of::<SocketRecord>();

/// Why the scan did not run or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// The kernel's BTF could not be read or lacks a member the program reads.
    #[error(
        "the kernel's BTF lacks what the socket scan reads ({0}); connections open before the agent \
         started are learned when they reconnect"
    )]
    Offsets(String),
    /// The kernel refused the object, the program or the iterator.
    #[error(
        "loading the socket scan (BPF iterator iter/task_file, Linux 5.11 or later for \
         bpf_sock_from_file) failed: {0}; connections open before the agent started are learned when \
         they reconnect"
    )]
    Load(String),
    /// Reading the iterator failed.
    #[error("reading the socket scan failed: {0}")]
    Read(#[source] std::io::Error),
    /// More listening ports than the cap: directions could not all be decided.
    #[error(
        "more than {max} listening sockets on this node: the socket scan cannot tell every \
         connection's direction, so it reports none; raise --max-existing-sockets \
         (NE_MAX_EXISTING_SOCKETS)"
    )]
    TooManyListeners {
        /// The cap that was passed.
        max: usize,
    },
}

/// The scan's counters, registered with the agent's metrics.
#[derive(Clone, Debug, Default)]
pub struct ScanMetrics {
    /// Socket records read from the iterator (TCP established or listening, UDP bound).
    pub sockets: Counter,
    /// Connection events produced.
    pub connections: Counter,
    /// Connection records dropped past the cap.
    pub dropped: Counter,
    /// Scans that failed or gave up.
    pub failures: Counter,
}

impl ScanMetrics {
    /// Registers the counters under the agent's prefix.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "existing_sockets_scanned",
            "Sockets read by the start-up scan of connections open before the agent started",
            self.sockets.clone(),
        );
        registry.register(
            "existing_connections",
            "Connections open before the agent started, reported by the start-up scan",
            self.connections.clone(),
        );
        registry.register(
            "existing_sockets_dropped",
            "Connections the start-up scan dropped past --max-existing-sockets",
            self.dropped.clone(),
        );
        registry.register(
            "existing_scan_failures",
            "Start-up socket scans that failed (logged as a warning)",
            self.failures.clone(),
        );
    }
}

/// The offsets the scan program needs from this kernel's BTF; the error names every missing one.
pub fn scan_offsets(btf: &Btf) -> Result<ScanOffsets, ScanError> {
    let (kernel, _) = btf.kernel_offsets();
    let mut missing: Vec<BtfError> = Vec::new();
    let mut get = |strukt: &str, path: &str| match btf.member_offset(strukt, path) {
        Ok(off) => off,
        Err(err) => {
            missing.push(err);
            KernelOffsets::UNKNOWN
        }
    };
    let offsets = ScanOffsets {
        kernel,
        socket_sk: get("socket", "sk"),
        sk_family: get("sock", "__sk_common.skc_family"),
        sk_state: get("sock", "__sk_common.skc_state"),
        sk_num: get("sock", "__sk_common.skc_num"),
        sk_dport: get("sock", "__sk_common.skc_dport"),
        sk_rcv_saddr: get("sock", "__sk_common.skc_rcv_saddr"),
        sk_daddr: get("sock", "__sk_common.skc_daddr"),
        sk_v6_rcv_saddr: get("sock", "__sk_common.skc_v6_rcv_saddr"),
        sk_v6_daddr: get("sock", "__sk_common.skc_v6_daddr"),
        sk_protocol: get("sock", "sk_protocol"),
        task_tgid: get("task_struct", "tgid"),
        _pad: 0,
    };
    if missing.is_empty() {
        Ok(offsets)
    } else {
        let text: Vec<String> = missing.iter().map(ToString::to_string).collect();
        Err(ScanError::Offsets(text.join("; ")))
    }
}

/// Loads the iterator and starts one walk over every open file on the node: read the returned file
/// to its end for the [`SocketRecord`]s. The program is unloaded when the file is closed.
pub fn open() -> Result<std::fs::File, ScanError> {
    // Our BTF goes before aya parses its own copies (twice, below): they are not held at once.
    let offsets =
        scan_offsets(&Btf::from_kernel().map_err(|e| ScanError::Offsets(e.to_string()))?)?;
    tracing::debug!(?offsets, "socket scan offsets from BTF");
    let load = |e: &dyn std::fmt::Display| ScanError::Load(e.to_string());
    let mut ebpf = EbpfLoader::new()
        .override_global(SCAN_CONFIG_GLOBAL, &offsets, true)
        .load(SCAN_OBJECT)
        .map_err(|e| load(&e))?;
    let kernel_btf = aya::Btf::from_sys_fs().map_err(|e| load(&e))?;
    let program: &mut Iter = ebpf
        .program_mut(SCAN_PROGRAM)
        .ok_or_else(|| {
            load(&format!(
                "the embedded object has no program `{SCAN_PROGRAM}`"
            ))
        })?
        .try_into()
        .map_err(|e| load(&e))?;
    program.load("task_file", &kernel_btf).map_err(|e| {
        // The verifier's log is in the error's source chain; keep all of it.
        load(&crate::error::chain(&e))
    })?;
    let link = program.attach().map_err(|e| load(&e))?;
    let link = program.take_link(link).map_err(|e| load(&e))?;
    // The iterator's file holds the link and so the program; `ebpf` can go.
    link.into_file().map_err(|e| load(&e))
}

/// What [`read_records`] kept.
#[derive(Debug, Default)]
pub struct Records {
    /// Established TCP and connected UDP sockets, at most the cap.
    pub connections: Vec<SocketRecord>,
    /// (protocol, netns inode, port) of listening TCP sockets and bound, unconnected UDP sockets.
    pub listening: HashSet<(u8, u32, u16)>,
    /// Records read in all.
    pub read: u64,
    /// Connection records dropped past the cap.
    pub dropped: u64,
}

/// Reads records from `reader` to its end, keeping at most `max` connections and `max` listening
/// ports. The iterator writes whole records but a read may end inside one, so bytes are carried over.
pub fn read_records(mut reader: impl Read, max: usize) -> Result<Records, ScanError> {
    let mut out = Records::default();
    let mut buf = vec![0u8; 64 * 1024];
    let mut filled = 0;
    loop {
        let n = match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ScanError::Read(e)),
        };
        filled += n;
        let whole = filled - filled % RECORD_SIZE;
        for chunk in buf[..whole].chunks_exact(RECORD_SIZE) {
            // SAFETY: the chunk is exactly one record; SocketRecord is plain old data (every bit pattern
            // is valid) and read_unaligned makes no alignment assumption.
            let record = unsafe { std::ptr::read_unaligned(chunk.as_ptr().cast::<SocketRecord>()) };
            out.read += 1;
            if is_listening(&record) {
                if out.listening.len() >= max {
                    return Err(ScanError::TooManyListeners { max });
                }
                out.listening
                    .insert((record.protocol, record.netns_ino, record.local_port));
            } else if is_connection(&record) {
                if out.connections.len() >= max {
                    out.dropped += 1;
                } else {
                    out.connections.push(record);
                }
            }
        }
        buf.copy_within(whole..filled, 0);
        filled -= whole;
    }
    if filled != 0 {
        tracing::warn!(
            bytes = filled,
            "the socket scan ended inside a record; the partial record is ignored"
        );
    }
    Ok(out)
}

fn is_listening(r: &SocketRecord) -> bool {
    match r.protocol {
        IPPROTO_TCP => r.state == TCP_LISTEN,
        IPPROTO_UDP => r.state != TCP_ESTABLISHED && r.local_port != 0,
        _ => false,
    }
}

fn is_connection(r: &SocketRecord) -> bool {
    matches!(r.protocol, IPPROTO_TCP | IPPROTO_UDP) && r.state == TCP_ESTABLISHED
}

/// The events the live path would have produced for these connections, stamped `now` (kernel
/// CLOCK_MONOTONIC). A socket held by several processes is one connection.
pub fn connection_events(records: &Records, now: Duration) -> Vec<ConnectionEvent> {
    let mut seen = HashSet::new();
    let mut events = Vec::new();
    for r in &records.connections {
        let inbound = records
            .listening
            .contains(&(r.protocol, r.netns_ino, r.local_port));
        let (direction, outcome) = match (r.protocol, inbound) {
            (IPPROTO_TCP, true) => (Direction::Inbound, Outcome::Established),
            (IPPROTO_TCP, false) => (Direction::Outbound, Outcome::Established),
            (_, true) => (Direction::Inbound, Outcome::Datagram),
            (_, false) => (Direction::Outbound, Outcome::Datagram),
        };
        let mut raw = FlowEvent::zeroed();
        raw.timestamp_ns = u64::try_from(now.as_nanos()).unwrap_or(u64::MAX);
        raw.cgroup_id = r.cgroup_id;
        raw.netns_ino = r.netns_ino;
        // As live: an inbound TCP connection is established in softirq context, with no process.
        raw.pid = if r.protocol == IPPROTO_TCP && inbound {
            0
        } else {
            r.pid
        };
        raw.local_addr = r.local_addr;
        raw.remote_addr = r.remote_addr;
        raw.local_port = r.local_port;
        raw.remote_port = r.remote_port;
        raw.family = r.family;
        raw.protocol = r.protocol;
        raw.direction = direction as u8;
        raw.outcome = outcome as u8;
        // The kernel's own decoding, so IPv4-mapped addresses become IPv4 exactly as in live events.
        let Ok(event) = ConnectionEvent::from_raw(&raw) else {
            continue;
        };
        if seen.insert((event.netns_ino, event.protocol, event.local, event.remote)) {
            events.push(event);
        }
    }
    events
}

/// One finished scan.
#[derive(Debug)]
pub struct Scan {
    /// One event per connection open at the time of the scan.
    pub events: Vec<ConnectionEvent>,
    /// Socket records read.
    pub sockets: u64,
    /// Connection records dropped past the cap.
    pub dropped: u64,
    /// How long the scan took (load, walk, conversion).
    pub elapsed: Duration,
}

/// Runs one scan (blocking: call it off the async runtime).
pub fn scan(max_sockets: usize) -> Result<Scan, ScanError> {
    let started = Instant::now();
    let file = open()?;
    let records = read_records(file, max_sockets)?;
    let events = connection_events(&records, monotonic_now());
    Ok(Scan {
        events,
        sockets: records.read,
        dropped: records.dropped,
        elapsed: started.elapsed(),
    })
}

/// Runs one scan on a blocking thread and hands its events over; on failure logs a warning, counts it
/// and hands over nothing. The receiver is closed without a value then.
pub fn spawn(
    max_sockets: usize,
    metrics: ScanMetrics,
) -> tokio::sync::oneshot::Receiver<Vec<ConnectionEvent>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::task::spawn_blocking(move || {
        let scanned = scan(max_sockets);
        // The scan's BTF parses are freed: hand the memory back rather than keep it for nothing.
        crate::memory::release_freed();
        match scanned {
            Ok(scan) => {
                metrics.sockets.inc_by(scan.sockets);
                metrics.connections.inc_by(scan.events.len() as u64);
                metrics.dropped.inc_by(scan.dropped);
                tracing::info!(
                    sockets = scan.sockets,
                    connections = scan.events.len(),
                    dropped = scan.dropped,
                    elapsed_ms = scan.elapsed.as_millis() as u64,
                    "scanned connections open before the agent started"
                );
                if scan.dropped > 0 {
                    tracing::warn!(
                        dropped = scan.dropped,
                        max_sockets,
                        "more connections open than --max-existing-sockets (NE_MAX_EXISTING_SOCKETS): the \
                     rest are learned when they reconnect"
                    );
                }
                // A closed receiver means the agent is stopping: nothing to hand over to.
                let _ = tx.send(scan.events);
            }
            Err(err) => {
                metrics.failures.inc();
                tracing::warn!(%err, "start-up socket scan failed; the agent goes on without it");
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::events::Protocol;
    use network_enforcer_agent_common::{AF_INET, AF_INET6};
    use std::net::SocketAddr;

    fn record(
        protocol: u8,
        state: u8,
        netns: u32,
        local: &str,
        remote: Option<&str>,
    ) -> SocketRecord {
        let mut r = SocketRecord::zeroed();
        r.protocol = protocol;
        r.state = state;
        r.netns_ino = netns;
        r.cgroup_id = 7;
        r.pid = 42;
        let addr = |text: &str| -> ([u8; 16], u16, u16) {
            let a: SocketAddr = text.parse().unwrap();
            match a {
                SocketAddr::V4(v4) => {
                    let mut b = [0u8; 16];
                    b[..4].copy_from_slice(&v4.ip().octets());
                    (b, v4.port(), AF_INET)
                }
                SocketAddr::V6(v6) => (v6.ip().octets(), v6.port(), AF_INET6),
            }
        };
        let (l, lp, family) = addr(local);
        r.local_addr = l;
        r.local_port = lp;
        r.family = family;
        if let Some(remote) = remote {
            let (a, p, _) = addr(remote);
            r.remote_addr = a;
            r.remote_port = p;
        }
        r
    }

    fn bytes(records: &[SocketRecord]) -> Vec<u8> {
        records
            .iter()
            .flat_map(|r| {
                // SAFETY: SocketRecord is repr(C) plain data without implicit padding.
                unsafe {
                    std::slice::from_raw_parts((r as *const SocketRecord).cast::<u8>(), RECORD_SIZE)
                }
                .to_vec()
            })
            .collect()
    }

    /// Hands out at most `step` bytes per read, so records straddle reads.
    struct Trickle(Vec<u8>, usize, usize);

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.1.min(buf.len()).min(self.0.len() - self.2);
            buf[..n].copy_from_slice(&self.0[self.2..self.2 + n]);
            self.2 += n;
            Ok(n)
        }
    }

    const EST: u8 = TCP_ESTABLISHED;
    const CLOSE: u8 = 7;

    /// A pod (netns 100) serving TCP 5432 and UDP 4433, with a client pod (netns 200).
    fn sample() -> Vec<SocketRecord> {
        vec![
            // Server pod: the listener, an accepted connection, a connection of its own to a DNS server.
            record(IPPROTO_TCP, TCP_LISTEN, 100, "0.0.0.0:5432", None),
            record(
                IPPROTO_TCP,
                EST,
                100,
                "10.0.0.1:5432",
                Some("10.0.0.2:40000"),
            ),
            record(
                IPPROTO_UDP,
                EST,
                100,
                "10.0.0.1:50000",
                Some("10.96.0.10:53"),
            ),
            // A QUIC-style server: the bound socket and one connected per peer on the same port.
            record(IPPROTO_UDP, CLOSE, 100, "0.0.0.0:4433", None),
            record(
                IPPROTO_UDP,
                EST,
                100,
                "10.0.0.1:4433",
                Some("10.0.0.2:41000"),
            ),
            // Client pod: its end of the connection, held by two processes (one connection), and a
            // dual-stack socket speaking IPv4 (reported as IPv4, as live events are).
            record(
                IPPROTO_TCP,
                EST,
                200,
                "10.0.0.2:40000",
                Some("10.0.0.1:5432"),
            ),
            record(
                IPPROTO_TCP,
                EST,
                200,
                "10.0.0.2:40000",
                Some("10.0.0.1:5432"),
            ),
            record(
                IPPROTO_TCP,
                EST,
                200,
                "[::ffff:10.0.0.2]:40001",
                Some("[::ffff:10.0.0.1]:5432"),
            ),
            // Another namespace listening on the client's local port: listeners count in their own
            // namespace only, so the client's connection stays outbound.
            record(IPPROTO_TCP, TCP_LISTEN, 300, "0.0.0.0:40000", None),
            // An unbound UDP socket and a TCP socket in another state are not connections.
            record(IPPROTO_UDP, CLOSE, 200, "0.0.0.0:0", None),
        ]
    }

    fn summary(
        events: &[ConnectionEvent],
    ) -> Vec<(u32, Protocol, Direction, Outcome, String, u16)> {
        events
            .iter()
            .map(|e| {
                let port = crate::aggregate::EdgeKey::of(e).port;
                (
                    e.netns_ino.unwrap(),
                    e.protocol,
                    e.direction,
                    e.outcome,
                    format!("{} -> {}", e.local, e.remote),
                    port,
                )
            })
            .collect()
    }

    #[test]
    fn connections_are_directed_by_the_listeners_of_their_own_namespace() {
        let records = read_records(Trickle(bytes(&sample()), 13, 0), 100).unwrap();
        assert_eq!(records.read, 10);
        assert_eq!(records.connections.len(), 6);
        let events = connection_events(&records, Duration::from_secs(5));
        use Direction::*;
        use Outcome::*;
        use Protocol::*;
        assert_eq!(
            summary(&events),
            [
                (
                    100,
                    Tcp,
                    Inbound,
                    Established,
                    "10.0.0.1:5432 -> 10.0.0.2:40000".into(),
                    5432
                ),
                (
                    100,
                    Udp,
                    Outbound,
                    Datagram,
                    "10.0.0.1:50000 -> 10.96.0.10:53".into(),
                    53
                ),
                (
                    100,
                    Udp,
                    Inbound,
                    Datagram,
                    "10.0.0.1:4433 -> 10.0.0.2:41000".into(),
                    4433
                ),
                (
                    200,
                    Tcp,
                    Outbound,
                    Established,
                    "10.0.0.2:40000 -> 10.0.0.1:5432".into(),
                    5432
                ),
                (
                    200,
                    Tcp,
                    Outbound,
                    Established,
                    "10.0.0.2:40001 -> 10.0.0.1:5432".into(),
                    5432
                ),
            ]
        );
        // As live events: inbound TCP has no process, everything else the holder's; count 1 each.
        assert_eq!(events[0].pid, None);
        assert_eq!(events[1].pid, Some(42));
        assert_eq!(events[3].pid, Some(42));
        assert!(events.iter().all(|e| e.count == 1
            && e.cgroup_id == Some(7)
            && e.monotonic == Duration::from_secs(5)));
        assert!(events[4].local.is_ipv4(), "{:?}", events[4].local);
    }

    #[test]
    fn connections_past_the_cap_are_counted_and_too_many_listeners_give_up() {
        // The sample holds 3 listening ports and 6 connection records.
        let records = read_records(bytes(&sample()).as_slice(), 3).unwrap();
        assert_eq!(records.connections.len(), 3);
        assert_eq!(records.dropped, 3);
        let many: Vec<SocketRecord> = (1..=3)
            .map(|p| record(IPPROTO_TCP, TCP_LISTEN, 1, &format!("0.0.0.0:{p}"), None))
            .collect();
        let err = read_records(bytes(&many).as_slice(), 2).unwrap_err();
        assert!(err.to_string().contains("--max-existing-sockets"), "{err}");
    }

    #[test]
    fn a_partial_record_at_the_end_is_ignored() {
        let mut data = bytes(&sample()[..2]);
        data.extend([1, 2, 3]);
        let records = read_records(data.as_slice(), 100).unwrap();
        assert_eq!((records.read, records.connections.len()), (2, 1));
    }

    #[test]
    fn every_offset_is_found_in_this_kernels_btf() {
        let btf = Btf::from_kernel().expect("the agent requires a kernel with BTF");
        let offsets = scan_offsets(&btf).unwrap();
        assert!(offsets.sk_num < 64 && offsets.sk_family < 64, "{offsets:?}");
    }
}
