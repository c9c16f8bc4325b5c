//! Aggregation of connection events into edges: identical edges (local side, peer address, port,
//! protocol, direction, outcome) become one record with first_seen, last_seen and count, flushed on an
//! interval. The kernel already dedupes within its window and tells how many occurrences each event
//! stands for ([`ConnectionEvent::count`]); this adds those up over the flush interval.
//!
//! Until pods are attributed, the local side is identified by what the kernel knows: the network
//! namespace (one per pod), the cgroup and the local IP.

use crate::kernel::events::{ConnectionEvent, Direction, Outcome, Protocol};
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

/// What makes two events the same edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EdgeKey {
    /// The local side's network namespace inode (a pod, or the host).
    pub netns_ino: Option<u32>,
    /// The local side's cgroup v2 id.
    pub cgroup_id: Option<u64>,
    /// The local address (unspecified for a UDP socket not bound to one address).
    pub local_ip: IpAddr,
    /// The peer's address.
    pub peer_ip: IpAddr,
    /// The service port: the peer's port for outbound edges, the local port for inbound ones (the other
    /// end's port is ephemeral and would split one edge into many).
    pub port: u16,
    /// TCP or UDP.
    pub protocol: Protocol,
    /// Who opened the connection.
    pub direction: Direction,
    /// Established, failed, or a datagram.
    pub outcome: Outcome,
}

impl EdgeKey {
    /// The edge an event belongs to.
    pub fn of(event: &ConnectionEvent) -> Self {
        let port = match event.direction {
            Direction::Outbound => event.remote.port(),
            Direction::Inbound => event.local.port(),
        };
        Self {
            netns_ino: event.netns_ino,
            cgroup_id: event.cgroup_id,
            local_ip: event.local.ip(),
            peer_ip: event.remote.ip(),
            port,
            protocol: event.protocol,
            direction: event.direction,
            outcome: event.outcome,
        }
    }
}

/// How often and when an edge was seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EdgeStats {
    /// Kernel time (CLOCK_MONOTONIC) of the first event in this interval.
    pub first_seen: Duration,
    /// Kernel time (CLOCK_MONOTONIC) of the last event in this interval.
    pub last_seen: Duration,
    /// Occurrences, including those the kernel's dedupe folded into an event.
    pub count: u64,
    /// The last socket error seen on a failed edge.
    pub last_error: Option<u8>,
}

impl EdgeStats {
    /// Folds `other` (the same edge, seen elsewhere or later) into these.
    pub fn merge(&mut self, other: &EdgeStats) {
        self.first_seen = self.first_seen.min(other.first_seen);
        if other.last_seen >= self.last_seen {
            self.last_error = other.last_error.or(self.last_error);
        }
        self.last_seen = self.last_seen.max(other.last_seen);
        self.count = self.count.saturating_add(other.count);
    }
}

/// One aggregated edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edge {
    /// What the edge is.
    pub key: EdgeKey,
    /// How often and when.
    pub stats: EdgeStats,
}

/// Edges remembered as already flushed, to tell a new edge from a repeat; when full the memory starts
/// over (every edge then counts as new once more: one early flush, nothing lost).
pub const KNOWN_EDGES: usize = 65_536;

/// Accumulates events into edges until drained.
#[derive(Default)]
pub struct Aggregator {
    edges: HashMap<EdgeKey, EdgeStats>,
    /// Edges flushed before (bounded by [`KNOWN_EDGES`]).
    known: HashSet<EdgeKey>,
    /// Edges held now that were never flushed before.
    new_edges: usize,
}

impl Aggregator {
    /// An empty aggregator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one event to its edge.
    pub fn add(&mut self, event: &ConnectionEvent) {
        let count = u64::from(event.count.max(1));
        let key = EdgeKey::of(event);
        match self.edges.entry(key) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                let s = e.get_mut();
                s.first_seen = s.first_seen.min(event.monotonic);
                s.last_seen = s.last_seen.max(event.monotonic);
                s.count += count;
                s.last_error = event.error.or(s.last_error);
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                if !self.known.contains(&key) {
                    self.new_edges += 1;
                }
                e.insert(EdgeStats {
                    first_seen: event.monotonic,
                    last_seen: event.monotonic,
                    count,
                    last_error: event.error,
                });
            }
        }
    }

    /// Edges held that no earlier drain returned: a connection never seen before, which the agent
    /// reports without waiting for the next tick (learning it is what users wait for).
    pub fn new_edges(&self) -> usize {
        self.new_edges
    }

    /// Adds an already aggregated edge (e.g. from the agent's recent-records buffer).
    pub fn add_edge(&mut self, key: EdgeKey, stats: EdgeStats) {
        self.edges
            .entry(key)
            .and_modify(|s| s.merge(&stats))
            .or_insert(stats);
    }

    /// Number of distinct edges held.
    pub fn len(&self) -> usize {
        self.edges.len()
    }

    /// Whether no edge is held.
    pub fn is_empty(&self) -> bool {
        self.edges.is_empty()
    }

    /// Takes every edge, oldest first (ties in key order, so the output is deterministic).
    pub fn drain(&mut self) -> Vec<Edge> {
        if self.known.len() + self.edges.len() > KNOWN_EDGES {
            self.known.clear();
        }
        self.new_edges = 0;
        let known = &mut self.known;
        let mut edges: Vec<Edge> = self
            .edges
            .drain()
            .map(|(key, stats)| {
                known.insert(key);
                Edge { key, stats }
            })
            .collect();
        edges.sort_by_key(|a| (a.stats.first_seen, a.key));
        edges
    }
}

/// The kernel's CLOCK_MONOTONIC now: the clock event timestamps (`bpf_ktime_get_ns`) use.
pub fn monotonic_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the valid timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Converts kernel CLOCK_MONOTONIC times to wall-clock time, using the offset between the two clocks
/// measured when it is created (good to the millisecond while the clock is not stepped).
#[derive(Clone, Copy, Debug)]
pub struct WallClock {
    boot: SystemTime,
}

impl WallClock {
    /// Measures the offset now.
    pub fn now() -> Self {
        Self {
            boot: SystemTime::now() - monotonic_now(),
        }
    }

    /// The wall-clock time of a kernel timestamp.
    pub fn at(&self, monotonic: Duration) -> SystemTime {
        self.boot + monotonic
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_edges_never_drained_before_count_as_new() {
        let mut agg = Aggregator::new();
        let a = event(1, "10.0.0.2:80", "10.0.0.1:40000", Direction::Outbound, 1);
        let b = event(2, "10.0.0.3:80", "10.0.0.1:40001", Direction::Outbound, 1);
        agg.add(&a);
        agg.add(&a);
        assert_eq!(agg.new_edges(), 1);
        agg.drain();
        assert_eq!(agg.new_edges(), 0);
        // Seen again after a flush: a repeat, not new.
        agg.add(&a);
        assert_eq!(agg.new_edges(), 0);
        agg.add(&b);
        assert_eq!(agg.new_edges(), 1);
        agg.drain();
        agg.add(&b);
        assert_eq!(agg.new_edges(), 0);
    }

    fn event(
        secs: u64,
        remote: &str,
        local: &str,
        direction: Direction,
        count: u32,
    ) -> ConnectionEvent {
        ConnectionEvent {
            monotonic: Duration::from_secs(secs),
            protocol: Protocol::Tcp,
            direction,
            outcome: Outcome::Established,
            local: local.parse().unwrap(),
            remote: remote.parse().unwrap(),
            netns_ino: Some(7),
            cgroup_id: Some(9),
            pid: None,
            error: None,
            count,
        }
    }

    #[test]
    fn outbound_connections_from_different_ephemeral_ports_are_one_edge() {
        let mut agg = Aggregator::new();
        agg.add(&event(
            5,
            "10.0.0.2:80",
            "10.0.0.1:40000",
            Direction::Outbound,
            1,
        ));
        agg.add(&event(
            3,
            "10.0.0.2:80",
            "10.0.0.1:40001",
            Direction::Outbound,
            4,
        ));
        agg.add(&event(
            9,
            "10.0.0.2:80",
            "10.0.0.1:40002",
            Direction::Outbound,
            1,
        ));
        let edges = agg.drain();
        assert_eq!(edges.len(), 1);
        let e = edges[0];
        assert_eq!(
            (e.key.peer_ip, e.key.port),
            ("10.0.0.2".parse().unwrap(), 80)
        );
        assert_eq!(e.stats.count, 6, "kernel-folded occurrences are counted");
        assert_eq!(e.stats.first_seen, Duration::from_secs(3));
        assert_eq!(e.stats.last_seen, Duration::from_secs(9));
        assert!(agg.is_empty(), "drain empties");
    }

    #[test]
    fn inbound_edges_key_on_the_local_port_and_stay_apart_from_outbound() {
        let mut agg = Aggregator::new();
        agg.add(&event(
            1,
            "10.0.0.9:50000",
            "10.0.0.1:8080",
            Direction::Inbound,
            1,
        ));
        agg.add(&event(
            2,
            "10.0.0.9:50001",
            "10.0.0.1:8080",
            Direction::Inbound,
            1,
        ));
        agg.add(&event(
            3,
            "10.0.0.9:8080",
            "10.0.0.1:50002",
            Direction::Outbound,
            1,
        ));
        let edges = agg.drain();
        assert_eq!(edges.len(), 2);
        assert_eq!(
            (
                edges[0].key.direction,
                edges[0].key.port,
                edges[0].stats.count
            ),
            (Direction::Inbound, 8080, 2)
        );
        assert_eq!(
            (
                edges[1].key.direction,
                edges[1].key.port,
                edges[1].stats.count
            ),
            (Direction::Outbound, 8080, 1)
        );
    }

    #[test]
    fn different_namespaces_are_different_edges() {
        let mut agg = Aggregator::new();
        let a = event(1, "10.0.0.2:80", "10.0.0.1:40000", Direction::Outbound, 1);
        let mut b = a;
        b.netns_ino = Some(8);
        agg.add(&a);
        agg.add(&b);
        assert_eq!(agg.len(), 2);
    }

    #[test]
    fn wall_clock_maps_kernel_time_to_now() {
        let clock = WallClock::now();
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes into the valid timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let kernel_now = Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32);
        let wall = clock.at(kernel_now);
        let skew = match wall.duration_since(SystemTime::now()) {
            Ok(ahead) => ahead,
            Err(behind) => behind.duration(),
        };
        assert!(skew < Duration::from_secs(1), "{skew:?}");
    }
}
