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
use std::time::Duration;

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

/// [`EdgeKey`] packed into six words: the key the aggregation maps hash and compare once per event,
/// so it must be cheap (field-by-field hashing of addresses and options was half the pipeline's time).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EdgeId([u64; 6]);

impl EdgeId {
    /// The id of `key`: equal keys, and only those, give equal ids.
    pub fn of(key: &EdgeKey) -> Self {
        fn addr(ip: IpAddr) -> (u64, u64, u64) {
            let (v6, bits) = match ip {
                IpAddr::V4(v4) => (0, u128::from(u32::from(v4))),
                IpAddr::V6(v6) => (1, u128::from(v6)),
            };
            (v6, (bits >> 64) as u64, bits as u64)
        }
        let (local_v6, local_hi, local_lo) = addr(key.local_ip);
        let (peer_v6, peer_hi, peer_lo) = addr(key.peer_ip);
        let protocol = match key.protocol {
            Protocol::Tcp => 0,
            Protocol::Udp => 1,
        };
        let head = u64::from(key.netns_ino.unwrap_or(0))
            | u64::from(key.port) << 32
            | protocol << 48
            | (key.direction as u64 & 0xf) << 49
            | (key.outcome as u64 & 0xf) << 53
            | u64::from(key.netns_ino.is_some()) << 57
            | u64::from(key.cgroup_id.is_some()) << 58
            | local_v6 << 59
            | peer_v6 << 60;
        Self([
            head,
            key.cgroup_id.unwrap_or(0),
            local_hi,
            local_lo,
            peer_hi,
            peer_lo,
        ])
    }

    /// The id of the edge `event` belongs to.
    pub fn of_event(event: &ConnectionEvent) -> Self {
        Self::of(&EdgeKey::of(event))
    }
}

/// The hasher of the aggregation maps: fast, and keyed at random per process so that a pod choosing
/// its peers and ports cannot aim for collisions.
pub type EdgeHasher = ahash::RandomState;

/// Edges remembered as already flushed, to tell a new edge from a repeat; when full the memory starts
/// over (every edge then counts as new once more: one early flush, nothing lost).
pub const KNOWN_EDGES: usize = 65_536;

/// What [`Aggregator::add_with`] did with an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Added {
    /// Folded into an edge already held.
    Repeat,
    /// Started a new edge.
    New,
    /// Started no edge: the tag function refused it.
    Refused,
}

/// Accumulates events into edges until drained. Each edge carries a tag `T` chosen when it starts (the
/// agent's pipeline tags edges with their owner, so an edge is attributed once per flush interval).
pub struct Aggregator<T = ()> {
    edges: HashMap<EdgeId, (Edge, T), EdgeHasher>,
    /// Edges flushed before (bounded by [`KNOWN_EDGES`]).
    known: HashSet<EdgeId, EdgeHasher>,
    /// Edges held now that were never flushed before.
    new_edges: usize,
}

impl<T> Default for Aggregator<T> {
    fn default() -> Self {
        Self {
            edges: HashMap::default(),
            known: HashSet::default(),
            new_edges: 0,
        }
    }
}

impl Aggregator<()> {
    /// An empty aggregator without a limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes every edge, oldest first (ties in key order, so the output is deterministic).
    pub fn drain(&mut self) -> Vec<Edge> {
        self.drain_tagged().into_iter().map(|(e, ())| e).collect()
    }
}

impl<T: Default> Aggregator<T> {
    /// Adds one event to its edge.
    pub fn add(&mut self, event: &ConnectionEvent) -> Added {
        let key = EdgeKey::of(event);
        self.add_with(event, key, EdgeId::of(&key), |_| Some(T::default()))
    }

    /// Adds an already aggregated edge (e.g. from the agent's recent-records buffer).
    pub fn add_edge(&mut self, key: EdgeKey, stats: EdgeStats) {
        self.edges
            .entry(EdgeId::of(&key))
            .and_modify(|(e, _)| e.stats.merge(&stats))
            .or_insert((Edge { key, stats }, T::default()));
    }
}

impl<T> Aggregator<T> {
    /// Adds `event`, whose edge is `key` with id `id`, to its edge. For an edge not held yet, `tag` is
    /// asked for the edge's tag; `None` refuses the edge (and the event).
    pub fn add_with(
        &mut self,
        event: &ConnectionEvent,
        key: EdgeKey,
        id: EdgeId,
        tag: impl FnOnce(&EdgeKey) -> Option<T>,
    ) -> Added {
        let count = u64::from(event.count.max(1));
        match self.edges.entry(id) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                let s = &mut e.get_mut().0.stats;
                s.first_seen = s.first_seen.min(event.monotonic);
                s.last_seen = s.last_seen.max(event.monotonic);
                s.count = s.count.saturating_add(count);
                s.last_error = event.error.or(s.last_error);
                Added::Repeat
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                let Some(tag) = tag(&key) else {
                    return Added::Refused;
                };
                if !self.known.contains(&id) {
                    self.new_edges += 1;
                }
                let stats = EdgeStats {
                    first_seen: event.monotonic,
                    last_seen: event.monotonic,
                    count,
                    last_error: event.error,
                };
                e.insert((Edge { key, stats }, tag));
                Added::New
            }
        }
    }

    /// The tag of the edge `id`, if held.
    pub fn tag(&self, id: &EdgeId) -> Option<&T> {
        self.edges.get(id).map(|(_, tag)| tag)
    }

    /// Edges held that no earlier drain returned: a connection never seen before, which the agent
    /// reports without waiting for the next tick (learning it is what users wait for).
    pub fn new_edges(&self) -> usize {
        self.new_edges
    }

    /// Number of distinct edges held.
    pub fn len(&self) -> usize {
        self.edges.len()
    }

    /// Whether no edge is held.
    pub fn is_empty(&self) -> bool {
        self.edges.is_empty()
    }

    /// Takes every edge with its tag, oldest first (ties in key order, so the output is deterministic).
    pub fn drain_tagged(&mut self) -> Vec<(Edge, T)> {
        if self.known.len() + self.edges.len() > KNOWN_EDGES {
            self.known.clear();
        }
        self.new_edges = 0;
        let known = &mut self.known;
        let mut edges: Vec<(Edge, T)> = self
            .edges
            .drain()
            .map(|(id, slot)| {
                known.insert(id);
                slot
            })
            .collect();
        edges.sort_by_key(|(a, _)| (a.stats.first_seen, a.key));
        edges
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
    fn a_refused_edge_is_not_held_and_is_asked_about_again() {
        let mut agg = Aggregator::<u8>::default();
        let a = event(1, "10.0.0.2:80", "10.0.0.1:40000", Direction::Outbound, 1);
        let key = EdgeKey::of(&a);
        let id = EdgeId::of(&key);
        assert_eq!(agg.add_with(&a, key, id, |_| None), Added::Refused);
        assert!(agg.is_empty() && agg.new_edges() == 0);
        assert_eq!(agg.add_with(&a, key, id, |_| Some(7)), Added::New);
        assert_eq!(
            agg.add_with(&a, key, id, |_| panic!("asked for a held edge")),
            Added::Repeat
        );
        assert_eq!(agg.tag(&id), Some(&7));
        let edges = agg.drain_tagged();
        assert_eq!((edges[0].0.stats.count, edges[0].1), (2, 7));
    }

    #[test]
    fn edge_ids_tell_apart_keys_that_differ_in_one_field() {
        let base = EdgeKey::of(&event(
            1,
            "10.0.0.2:80",
            "10.0.0.1:4000",
            Direction::Outbound,
            1,
        ));
        let v4: IpAddr = "10.0.0.2".parse().unwrap();
        let mapped = IpAddr::V6(match v4 {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        });
        let variants = [
            EdgeKey {
                netns_ino: None,
                ..base
            },
            EdgeKey {
                netns_ino: Some(0),
                ..base
            },
            EdgeKey {
                cgroup_id: None,
                ..base
            },
            EdgeKey {
                cgroup_id: Some(0),
                ..base
            },
            EdgeKey {
                peer_ip: mapped,
                ..base
            },
            EdgeKey {
                local_ip: mapped,
                ..base
            },
            EdgeKey { port: 81, ..base },
            EdgeKey {
                protocol: Protocol::Udp,
                ..base
            },
            EdgeKey {
                direction: Direction::Inbound,
                ..base
            },
            EdgeKey {
                outcome: Outcome::Failed,
                ..base
            },
            EdgeKey {
                outcome: Outcome::Datagram,
                ..base
            },
        ];
        let mut ids = vec![EdgeId::of(&base)];
        ids.extend(variants.iter().map(EdgeId::of));
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(EdgeId::of(&base), EdgeId::of(&{ base }));
    }

    proptest::proptest! {
        /// Equal ids exactly when the keys are equal, over small domains where collisions are likely.
        #[test]
        fn edge_ids_are_equal_exactly_when_keys_are(
            a in key_strategy(),
            b in key_strategy(),
        ) {
            proptest::prop_assert_eq!(EdgeId::of(&a) == EdgeId::of(&b), a == b);
        }
    }

    fn key_strategy() -> impl proptest::strategy::Strategy<Value = EdgeKey> {
        use proptest::prelude::*;
        let ip = prop_oneof![
            (0u8..3).prop_map(|x| IpAddr::from([10, 0, 0, x])),
            (0u16..3).prop_map(|x| IpAddr::from([0, 0, 0, 0, 0, 0xffff, 0x0a00, x])),
            (0u16..3).prop_map(|x| IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, x])),
        ];
        (
            proptest::option::of(0u32..3),
            proptest::option::of(0u64..3),
            ip.clone(),
            ip,
            0u16..3,
            any::<bool>(),
            any::<bool>(),
            0u8..3,
        )
            .prop_map(
                |(netns_ino, cgroup_id, local_ip, peer_ip, port, udp, inbound, outcome)| EdgeKey {
                    netns_ino,
                    cgroup_id,
                    local_ip,
                    peer_ip,
                    port,
                    protocol: if udp { Protocol::Udp } else { Protocol::Tcp },
                    direction: if inbound {
                        Direction::Inbound
                    } else {
                        Direction::Outbound
                    },
                    outcome: [Outcome::Established, Outcome::Failed, Outcome::Datagram]
                        [usize::from(outcome)],
                },
            )
    }
}
