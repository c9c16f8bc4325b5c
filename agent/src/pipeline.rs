//! The agent's user-space pipeline, the path every kernel event takes (docs/behaviour.md §7.2; the
//! stage diagram: docs/design.md, "Architecture"):
//!
//! read (the caller hands in batches from [`crate::kernel::events::EventReader`]) → **attribute** (each
//! edge once per flush interval, when it starts) → **aggregate** into edges → hand to a tap
//! ([`EventTap`]: the debug API) → **flush** (edges with their owners, turned into uplink records).
//!
//! `run` and `cargo xtask bench agent` both drive this type, so the figure the bench prints is the
//! agent's. I/O stays outside: the caller reads the ring buffer and sends the records.
//!
//! Bounds: at most [`EdgeCaps::per_pod`] distinct edges per pod and [`EdgeCaps::per_node`] in all per
//! [`EdgeCaps::interval`] (the regular flush interval: early flushes for new edges do not renew the
//! budget). Events of further new edges are dropped and counted ([`Dropped`]), so a pod sending to every
//! port cannot grow the agent's memory, flood the uplink or crowd out its neighbours' edges.

use crate::aggregate::{Aggregator, Edge, EdgeHasher, EdgeId, EdgeKey};
use crate::clock::{WallClock, monotonic_now};
use crate::dns::tracker::{Limits, Tracker};
use crate::error::Result;
use crate::identity::attribution::{Attributor, Owner};
use crate::identity::pod_identity::Scanner;
use crate::identity::pod_watch::SharedAttributor;
use crate::kernel::dns_messages::{DnsKind, DnsMessage};
use crate::kernel::events::{ConnectionEvent, Direction};
use crate::uplink;
use network_enforcer_api::uplink::{FlowRecord, LocalPod};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

/// How many distinct edges may be reported per interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EdgeCaps {
    /// Edges of one pod (or of the host, or of one unattributed namespace).
    pub per_pod: usize,
    /// Edges of the whole node.
    pub per_node: usize,
    /// How long a budget lasts.
    pub interval: Duration,
}

impl Default for EdgeCaps {
    /// 10,000 per pod and 100,000 per node per 10 s: far above what a workload reaches (a busy node
    /// flushes a few thousand), and about 20 MiB at the node's cap.
    fn default() -> Self {
        Self {
            per_pod: 10_000,
            per_node: 100_000,
            interval: Duration::from_secs(10),
        }
    }
}

/// Events dropped because their edge would have passed a cap (cumulative or per flush).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Over [`EdgeCaps::per_pod`].
    pub pod_cap: u64,
    /// Over [`EdgeCaps::per_node`].
    pub node_cap: u64,
}

impl Dropped {
    /// Events dropped for either cap.
    pub fn total(&self) -> u64 {
        self.pod_cap.saturating_add(self.node_cap)
    }
}

/// Whose edge count a new edge adds to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Local {
    Pod(Arc<str>),
    Host,
    /// Not attributed (yet): one bucket per network namespace, so one pod is still one bucket.
    Netns(Option<u32>),
}

impl Local {
    fn of(owner: &Owner, key: &EdgeKey) -> Self {
        match owner {
            Owner::Pod(pod) => Self::Pod(pod.uid.clone()),
            Owner::Host => Self::Host,
            Owner::Unknown => Self::Netns(key.netns_ino),
        }
    }
}

/// What one flush produced.
#[derive(Debug, Default)]
pub struct Flushed {
    /// Every edge held since the last flush with its owner, oldest first.
    pub edges: Vec<(Edge, Owner)>,
    /// Edges whose local side is no known pod nor the host.
    pub unattributed: usize,
    /// Events dropped by the caps since the last flush.
    pub dropped: Dropped,
    /// For each of `edges` (same index), the name its pod resolved the peer from, when the edge is
    /// outbound and the pod resolved the address before the edge's last connection (within the
    /// answer's TTL plus the grace).
    pub peer_names: Vec<Option<Arc<str>>>,
    /// What pods resolved since the last flush that the controller has not heard lately
    /// ([`Resolutions`]).
    pub resolutions: Vec<Resolved>,
}

impl Flushed {
    /// The uplink records: [`Flushed::edge_records`], then [`Flushed::resolution_records`].
    pub fn records(&self, clock: &WallClock) -> Vec<FlowRecord> {
        let mut records = self.edge_records(clock);
        records.extend(self.resolution_records(clock));
        records
    }

    /// The records of what pods resolved, which the controller has not heard lately.
    pub fn resolution_records(&self, clock: &WallClock) -> Vec<FlowRecord> {
        self.resolutions.iter().map(|r| r.record(clock)).collect()
    }

    /// The records of the edges: pods' edges only (the host's and unknown ones are counted, not
    /// sent). Without the pod watch, records carry the UID only (the controller accepts that).
    pub fn edge_records(&self, clock: &WallClock) -> Vec<FlowRecord> {
        // Sized once: a spray's flush has tens of thousands of edges, and growing by doubling
        // held twice their records for a moment.
        let mut records = Vec::with_capacity(self.edges.len());
        records.extend(self.edges.iter().enumerate().filter_map(
            |(i, (edge, owner))| match owner {
                Owner::Pod(pod) => {
                    let (namespace, name) = pod
                        .name
                        .as_ref()
                        .map(|(ns, n)| (ns.to_string(), n.to_string()))
                        .unwrap_or_default();
                    let local = LocalPod {
                        uid: pod.uid.to_string(),
                        namespace,
                        name,
                    };
                    let mut record = uplink::flow_record(edge, local, clock);
                    if let Some(Some(name)) = self.peer_names.get(i) {
                        record.peer_name = name.to_string();
                    }
                    Some(record)
                }
                Owner::Host | Owner::Unknown => None,
            },
        ));
        records
    }
}

/// What the pipeline knows of an event for a tap: its pod's label and, for an outbound connection to
/// an address the pod resolved, the name it resolved it from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributed {
    pub pod: Option<Arc<str>>,
    pub resolved_from: Option<Arc<str>>,
}

/// What sees each batch of events as the pipeline reads it, besides the aggregation: the debug API
/// (`crate::debug::socket::DebugServer`), which streams them to `flows`.
pub trait EventTap: Send + Sync {
    /// `events` as read; `attribute` says who each one is (a tap asks it once per edge new to it,
    /// not per event).
    fn publish(
        &self,
        events: &[ConnectionEvent],
        attribute: &mut dyn FnMut(&ConnectionEvent) -> Attributed,
    );
}

/// The pipeline; see the module documentation.
pub struct Pipeline {
    attributor: SharedAttributor,
    scanner: Option<Scanner>,
    tap: Option<Arc<dyn EventTap>>,
    aggregator: Aggregator<Owner>,
    caps: EdgeCaps,
    /// Distinct edges counted against the caps in this interval (at most `caps.per_node`).
    counted: HashSet<EdgeId, EdgeHasher>,
    /// Of those, per local side.
    per_local: HashMap<Local, usize>,
    interval_start: Instant,
    /// Dropped since the last flush.
    window_dropped: Dropped,
    dropped_total: Dropped,
    events: u64,
    /// What each pod resolved from which name, when DNS messages are read ([`Pipeline::take_dns`]).
    names: Option<Tracker>,
    resolutions: Resolutions,
    dns: DnsStats,
}

/// A name a pod resolved to an address, for the controller (an `OUTCOME_RESOLVED` record).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub pod: crate::identity::attribution::PodRef,
    pub name: Arc<str>,
    pub address: std::net::IpAddr,
    /// When the answer came (kernel monotonic time).
    pub at: Duration,
}

impl Resolved {
    fn record(&self, clock: &WallClock) -> FlowRecord {
        let (namespace, name) = self
            .pod
            .name
            .as_ref()
            .map(|(ns, n)| (ns.to_string(), n.to_string()))
            .unwrap_or_default();
        let at = uplink::epoch_ms(clock.at(self.at));
        FlowRecord {
            local: Some(LocalPod {
                uid: self.pod.uid.to_string(),
                namespace,
                name,
            }),
            peer_ip: network_enforcer_api::uplink::ip_bytes(self.address),
            direction: network_enforcer_api::uplink::Direction::Outbound as i32,
            outcome: network_enforcer_api::uplink::Outcome::Resolved as i32,
            first_seen_ms: at,
            last_seen_ms: at,
            count: 1,
            source: network_enforcer_api::uplink::Source::Ebpf as i32,
            peer_name: self.name.to_string(),
            ..FlowRecord::default()
        }
    }
}

/// What pods resolved, told to the controller once, and again after [`Resolutions::REPEAT`] while
/// they keep resolving it (so it knows the address is still current). Bounded: at most
/// [`Resolutions::MAX_PER_FLUSH`] new ones per flush and [`Resolutions::MAX_REMEMBERED`] remembered;
/// past either, the oldest are forgotten (told again later) and the excess counted.
#[derive(Debug, Default)]
struct Resolutions {
    pending: Vec<Resolved>,
    told: HashMap<(Arc<str>, Arc<str>, std::net::IpAddr), Duration>,
    dropped: u64,
}

impl Resolutions {
    const REPEAT: Duration = Duration::from_secs(60);
    const MAX_PER_FLUSH: usize = 2_000;
    const MAX_REMEMBERED: usize = 50_000;

    fn add(
        &mut self,
        pod: &crate::identity::attribution::PodRef,
        name: &Arc<str>,
        address: std::net::IpAddr,
        at: Duration,
    ) {
        let key = (pod.uid.clone(), name.clone(), address);
        if self
            .told
            .get(&key)
            .is_some_and(|told| at.saturating_sub(*told) < Self::REPEAT)
        {
            return;
        }
        if self.pending.len() >= Self::MAX_PER_FLUSH {
            self.dropped += 1;
            return;
        }
        if self.told.len() >= Self::MAX_REMEMBERED {
            let cutoff = at.saturating_sub(Self::REPEAT);
            self.told.retain(|_, told| *told >= cutoff);
            if self.told.len() >= Self::MAX_REMEMBERED {
                self.told.clear();
            }
        }
        self.told.insert(key, at);
        self.pending.push(Resolved {
            pod: pod.clone(),
            name: name.clone(),
            address,
            at,
        });
    }
}

/// DNS messages not handed to the tracker, by reason (the tracker counts its own refusals).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DnsStats {
    /// Messages of a socket that is no known pod's (the host's, or a pod not seen yet).
    pub unattributed: u64,
    /// Messages longer than the kernel copies (their end is missing).
    pub truncated: u64,
}

impl Pipeline {
    /// A pipeline attributing with `attributor` (fed by the pod watch), holding at most `caps` edges.
    pub fn new(attributor: SharedAttributor, caps: EdgeCaps) -> Self {
        Self {
            attributor,
            scanner: None,
            tap: None,
            aggregator: Aggregator::default(),
            caps,
            counted: HashSet::default(),
            per_local: HashMap::new(),
            interval_start: Instant::now(),
            window_dropped: Dropped::default(),
            dropped_total: Dropped::default(),
            events: 0,
            names: None,
            resolutions: Resolutions::default(),
            dns: DnsStats::default(),
        }
    }

    /// Reads the pods' DNS messages ([`Pipeline::take_dns`]) to name the outside peers they resolved,
    /// within `limits`.
    pub fn with_dns_names(mut self, limits: Limits) -> Self {
        self.names = Some(Tracker::new(limits));
        self
    }

    /// Takes in one DNS message a pod's socket sent or received. Hand in every message read before a
    /// batch of connection events first: an answer is captured before its pod can read it, so before
    /// the connection it leads to.
    pub fn take_dns(&mut self, message: &DnsMessage<'_>) {
        let Some(tracker) = &mut self.names else {
            return;
        };
        if message.truncated {
            self.dns.truncated += 1;
            return;
        }
        let owner = lock(&self.attributor).resolve_socket(
            message.cgroup_id,
            message.local.ip(),
            message.monotonic,
        );
        let Owner::Pod(pod) = owner else {
            self.dns.unattributed += 1;
            return;
        };
        let (local, server, payload, at) = (
            message.local,
            message.server,
            message.payload,
            message.monotonic,
        );
        match message.kind {
            DnsKind::Query => tracker.query(&pod.uid, local, server, payload, at),
            DnsKind::Answer => match tracker.answer(&pod.uid, local, server, payload, at) {
                Ok(believed) => {
                    for (address, name) in believed {
                        self.resolutions.add(&pod, &name, address, at);
                    }
                }
                Err(refused) => {
                    tracing::debug!(pod = %pod.label(), %server, %refused, "DNS answer not believed");
                }
            },
        }
    }

    /// What the DNS tracker counted so far (`None` when DNS messages are not read), and the
    /// messages not handed to it.
    pub fn dns_counters(&self) -> Option<(crate::dns::tracker::Counters, DnsStats)> {
        self.names
            .as_ref()
            .map(|tracker| (tracker.counters().clone(), self.dns))
    }

    /// Resolutions waiting for the next flush (worth an early flush: a protect policy may wait for
    /// them), and those dropped by the per-flush bound so far.
    pub fn new_resolutions(&self) -> (usize, u64) {
        (self.resolutions.pending.len(), self.resolutions.dropped)
    }

    /// Addresses held as resolved from a name (0 when DNS messages are not read).
    pub fn dns_names(&self) -> usize {
        self.names.as_ref().map_or(0, Tracker::resolved)
    }

    /// Scans /proc and the cgroup tree with `scanner` at every flush and when unknown namespaces show.
    pub fn with_scanner(mut self, scanner: Scanner) -> Self {
        self.scanner = Some(scanner);
        self
    }

    /// Hands every event to `tap` (the debug API).
    pub fn with_tap(mut self, tap: Arc<dyn EventTap>) -> Self {
        self.tap = Some(tap);
        self
    }

    /// Takes in one batch of events.
    pub fn take_in(&mut self, events: &[ConnectionEvent]) -> Result<()> {
        self.events += events.len() as u64;
        let mut unknown_netns = false;
        {
            let state = lock(&self.attributor);
            let (caps, counted, per_local, dropped) = (
                &self.caps,
                &mut self.counted,
                &mut self.per_local,
                &mut self.window_dropped,
            );
            for event in events {
                let key = EdgeKey::of(event);
                let id = EdgeId::of(&key);
                self.aggregator.add_with(event, key, id, |key| {
                    let owner =
                        state.resolve(key.netns_ino, key.cgroup_id, key.local_ip, event.monotonic);
                    if owner == Owner::Unknown && !state.knows_netns(key.netns_ino) {
                        unknown_netns = true;
                    }
                    if counted.contains(&id) {
                        // Already within this interval's budget (flushed early, seen again).
                        return Some(owner);
                    }
                    let held = per_local.entry(Local::of(&owner, key)).or_default();
                    if *held >= caps.per_pod {
                        dropped.pod_cap += 1;
                        return None;
                    }
                    if counted.len() >= caps.per_node {
                        dropped.node_cap += 1;
                        return None;
                    }
                    *held += 1;
                    counted.insert(id);
                    Some(owner)
                });
            }
        }
        // A namespace no scan knows is a pod that started since the last one: look again (at most once
        // a second) so the debug API names its events; the flush attributes its edges again anyway.
        if let (true, Some(scanner)) = (unknown_netns, &mut self.scanner) {
            scanner.scan_if_due()?;
        }
        if let Some(tap) = &self.tap {
            let state = lock(&self.attributor);
            let (aggregator, names) = (&self.aggregator, &self.names);
            // Asked once per edge new to the tap, not per event.
            tap.publish(events, &mut |e| {
                let owner = match aggregator.tag(&EdgeId::of_event(e)) {
                    Some(owner @ Owner::Pod(_)) => owner.clone(),
                    _ => state.resolve(e.netns_ino, e.cgroup_id, e.local.ip(), e.monotonic),
                };
                match owner {
                    Owner::Pod(pod) => Attributed {
                        resolved_from: names
                            .as_ref()
                            .filter(|_| e.direction == Direction::Outbound)
                            .and_then(|t| t.name_of(&pod.uid, e.remote.ip(), e.monotonic))
                            .map(Arc::from),
                        pod: Some(pod.label().into()),
                    },
                    Owner::Host | Owner::Unknown => Attributed::default(),
                }
            });
        }
        Ok(())
    }

    /// Edges held that were never flushed before (worth an early flush).
    pub fn new_edges(&self) -> usize {
        self.aggregator.new_edges()
    }

    /// Events taken in so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Events dropped by the caps so far.
    pub fn dropped(&self) -> Dropped {
        self.dropped_total
    }

    /// Takes every edge held with its owner. Pods come and go: the scan runs first, and edges not yet
    /// attributed to a named pod are attributed again with what it found.
    pub fn flush(&mut self) -> Result<Flushed> {
        if let Some(scanner) = &mut self.scanner {
            scanner.scan()?;
        }
        let mut state = lock(&self.attributor);
        state.expire(monotonic_now());
        let edges: Vec<(Edge, Owner)> = self
            .aggregator
            .drain_tagged()
            .into_iter()
            .map(|(edge, owner)| {
                let owner = match owner {
                    Owner::Pod(pod) if pod.name.is_some() => Owner::Pod(pod),
                    Owner::Host => Owner::Host,
                    _ => reattribute(&state, &edge),
                };
                (edge, owner)
            })
            .collect();
        let peer_names = match &mut self.names {
            Some(tracker) => {
                let names = edges
                    .iter()
                    .map(|(edge, owner)| match owner {
                        Owner::Pod(pod) if edge.key.direction == Direction::Outbound => tracker
                            .name_of(&pod.uid, edge.key.peer_ip, edge.stats.last_seen)
                            .map(Arc::from),
                        _ => None,
                    })
                    .collect();
                tracker.expire(monotonic_now());
                names
            }
            None => Vec::new(),
        };
        let unattributed = edges.iter().filter(|(_, o)| *o == Owner::Unknown).count();
        if self.interval_start.elapsed() >= self.caps.interval {
            self.counted.clear();
            self.per_local.clear();
            self.interval_start = Instant::now();
        }
        let dropped = std::mem::take(&mut self.window_dropped);
        self.dropped_total.pod_cap = self.dropped_total.pod_cap.saturating_add(dropped.pod_cap);
        self.dropped_total.node_cap = self.dropped_total.node_cap.saturating_add(dropped.node_cap);
        Ok(Flushed {
            edges,
            unattributed,
            dropped,
            peer_names,
            resolutions: std::mem::take(&mut self.resolutions.pending),
        })
    }
}

fn reattribute(state: &Attributor, edge: &Edge) -> Owner {
    let k = &edge.key;
    state.resolve(k.netns_ino, k.cgroup_id, k.local_ip, edge.stats.first_seen)
}

fn lock(attributor: &SharedAttributor) -> MutexGuard<'_, Attributor> {
    // Nothing panics while holding it; a poisoned state is still the best there is.
    attributor.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::attribution::PodInfo;
    use crate::kernel::events::{Direction, Outcome, Protocol};
    use std::sync::Mutex;
    use std::time::Duration;

    const HOST_NS: u32 = 1;

    fn uid(p: u32) -> String {
        format!("{p:08x}-0000-4000-8000-000000000000")
    }

    /// Pods 0..n, each in network namespace 100 + p with IP 10.0.0.(10 + p).
    fn attributor(pods: u32) -> SharedAttributor {
        let mut at = Attributor::default();
        for p in 0..pods {
            at.apply(
                PodInfo {
                    uid: uid(p),
                    namespace: "shop".into(),
                    name: format!("pod-{p}"),
                    ips: vec![format!("10.0.0.{}", 10 + p).parse().unwrap()],
                    host_network: false,
                },
                Duration::ZERO,
            );
        }
        let uids: Vec<String> = (0..pods).map(uid).collect();
        at.observe_scan(
            HOST_NS,
            uids.iter()
                .enumerate()
                .map(|(p, u)| (100 + p as u32, u.as_str())),
            std::iter::empty(),
            Duration::ZERO,
        );
        Arc::new(Mutex::new(at))
    }

    fn event(pod: u32, netns: u32, port: u16) -> ConnectionEvent {
        ConnectionEvent {
            monotonic: Duration::from_secs(1),
            protocol: Protocol::Udp,
            direction: Direction::Outbound,
            outcome: Outcome::Datagram,
            local: format!("10.0.0.{}:40000", 10 + pod).parse().unwrap(),
            remote: format!("10.1.0.1:{port}").parse().unwrap(),
            netns_ino: Some(netns),
            cgroup_id: None,
            pid: None,
            error: None,
            count: 1,
        }
    }

    /// A DNS message of pod `pod` (no cgroup: attributed by its IP) with server 10.96.0.10.
    fn dns(pod: u32, kind: DnsKind, payload: &[u8], at_ms: u64) -> DnsMessage<'_> {
        DnsMessage {
            monotonic: Duration::from_millis(at_ms),
            kind,
            cgroup_id: None,
            local: format!("10.0.0.{}:5353", 10 + pod).parse().unwrap(),
            server: "10.96.0.10:53".parse().unwrap(),
            payload,
            truncated: false,
        }
    }

    fn dns_exchange(id: u16, answer_ip: &str) -> (Vec<u8>, Vec<u8>) {
        use simple_dns::rdata::{A, RData};
        use simple_dns::{CLASS, Name, Packet, QCLASS, QTYPE, Question, ResourceRecord, TYPE};
        let question = Question::new(
            Name::new_unchecked("api.partner.test"),
            QTYPE::TYPE(TYPE::A),
            QCLASS::CLASS(CLASS::IN),
            false,
        );
        let mut query = Packet::new_query(id);
        query.questions.push(question.clone());
        let mut answer = Packet::new_reply(id);
        answer.questions.push(question);
        let ip: std::net::Ipv4Addr = answer_ip.parse().unwrap();
        answer.answers.push(ResourceRecord::new(
            Name::new_unchecked("api.partner.test"),
            CLASS::IN,
            60,
            RData::A(A {
                address: u32::from(ip),
            }),
        ));
        (
            query.build_bytes_vec().unwrap(),
            answer.build_bytes_vec().unwrap(),
        )
    }

    #[test]
    fn an_outbound_edge_carries_the_name_its_pod_resolved_the_peer_from() {
        let mut pipeline =
            Pipeline::new(attributor(2), EdgeCaps::default()).with_dns_names(Limits::default());
        let (query, answer) = dns_exchange(7, "10.1.0.1");
        pipeline.take_dns(&dns(0, DnsKind::Query, &query, 1_000));
        pipeline.take_dns(&dns(0, DnsKind::Answer, &answer, 1_001));
        // Pod 1 gets the same answer without having asked: not believed.
        pipeline.take_dns(&dns(1, DnsKind::Answer, &answer, 1_001));
        let at = |mut e: ConnectionEvent, ms: u64| {
            e.monotonic = Duration::from_millis(ms);
            e
        };
        let mut inbound = event(0, 100, 443);
        inbound.direction = Direction::Inbound;
        pipeline
            .take_in(&[
                at(event(0, 100, 443), 2_000), // after the answer: named
                at(event(0, 100, 8443), 500),  // before it: an address the pod had anyway
                at(event(1, 101, 443), 2_000), // the other pod never resolved it
                at(inbound, 2_000),            // inbound: the peer's name is not the pod's lookup
            ])
            .unwrap();
        let flushed = pipeline.flush().unwrap();
        let mut got: Vec<(String, u16, Direction, Option<String>)> = flushed
            .edges
            .iter()
            .zip(&flushed.peer_names)
            .map(|((e, o), n)| {
                let name = n.as_deref().map(str::to_string);
                (label(o), e.key.port, e.key.direction, name)
            })
            .collect();
        got.sort_by_key(|g| (g.0.clone(), g.1));
        assert_eq!(
            got,
            [
                (
                    "shop/pod-0".into(),
                    443,
                    Direction::Outbound,
                    Some("api.partner.test".into())
                ),
                ("shop/pod-0".into(), 8443, Direction::Outbound, None),
                ("shop/pod-0".into(), 40000, Direction::Inbound, None),
                ("shop/pod-1".into(), 443, Direction::Outbound, None),
            ]
        );
        let records = flushed.records(&WallClock::now());
        let named: Vec<(&str, i32, u32)> = records
            .iter()
            .filter(|r| !r.peer_name.is_empty())
            .map(|r| (r.peer_name.as_str(), r.outcome, r.port))
            .collect();
        use network_enforcer_api::uplink::Outcome as Wire;
        assert_eq!(
            named,
            [
                ("api.partner.test", Wire::Datagram as i32, 443),
                // What pod 0 resolved, for protect: told once.
                ("api.partner.test", Wire::Resolved as i32, 0),
            ],
            "the connection named, then the resolution"
        );
        // Resolved again within a minute: not told again.
        let (query, answer) = dns_exchange(8, "10.1.0.1");
        pipeline.take_dns(&dns(0, DnsKind::Query, &query, 3_000));
        pipeline.take_dns(&dns(0, DnsKind::Answer, &answer, 3_001));
        assert_eq!(pipeline.new_resolutions(), (0, 0));
        let (query, answer) = dns_exchange(9, "10.1.0.2");
        pipeline.take_dns(&dns(0, DnsKind::Query, &query, 4_000));
        pipeline.take_dns(&dns(0, DnsKind::Answer, &answer, 4_001));
        assert_eq!(pipeline.new_resolutions(), (1, 0), "a new address is");
        let (counters, stats) = pipeline.dns_counters().unwrap();
        assert_eq!((counters.answers, counters.unsolicited), (3, 1));
        assert_eq!(stats, DnsStats::default());
    }

    fn label(owner: &Owner) -> String {
        match owner {
            Owner::Pod(p) => p.label(),
            Owner::Host => "host".into(),
            Owner::Unknown => "unknown".into(),
        }
    }

    #[test]
    fn edges_are_attributed_when_they_start_and_flushed_with_their_owner() {
        let mut pipeline = Pipeline::new(attributor(2), EdgeCaps::default());
        let events = [
            event(0, 100, 53),
            event(0, 100, 53),
            event(1, 101, 53),
            event(0, HOST_NS, 80),
        ];
        pipeline.take_in(&events).unwrap();
        assert_eq!(pipeline.new_edges(), 3);
        let flushed = pipeline.flush().unwrap();
        let got: Vec<(String, u16, u64)> = flushed
            .edges
            .iter()
            .map(|(e, o)| (label(o), e.key.port, e.stats.count))
            .collect();
        assert_eq!(
            got,
            [
                ("host".to_string(), 80, 1),
                ("shop/pod-0".to_string(), 53, 2),
                ("shop/pod-1".to_string(), 53, 1),
            ]
        );
        assert_eq!(flushed.unattributed, 0);
        let records = flushed.records(&WallClock::now());
        assert_eq!(records.len(), 2, "the host's edge does not go up");
        assert_eq!(records[0].local.as_ref().unwrap().name, "pod-0");
        assert_eq!(pipeline.events(), 4);
    }

    #[test]
    fn an_edge_of_a_namespace_unknown_when_it_started_is_attributed_at_the_flush() {
        let attributor = attributor(1);
        let mut pipeline = Pipeline::new(attributor.clone(), EdgeCaps::default());
        pipeline.take_in(&[event(1, 555, 53)]).unwrap();
        // The scan finds the new pod's namespace before the flush.
        {
            let mut at = attributor.lock().unwrap();
            at.apply(
                PodInfo {
                    uid: uid(1),
                    namespace: "shop".into(),
                    name: "late".into(),
                    ips: vec![],
                    host_network: false,
                },
                Duration::ZERO,
            );
            // Scans are stamped with the kernel's clock; the flush expires older ones.
            at.observe_scan(HOST_NS, [(555, uid(1).as_str())], [], monotonic_now());
        }
        let flushed = pipeline.flush().unwrap();
        assert_eq!(label(&flushed.edges[0].1), "shop/late");
        assert_eq!(flushed.unattributed, 0);
    }

    #[test]
    fn one_pod_past_its_cap_loses_only_its_own_new_edges() {
        let caps = EdgeCaps {
            per_pod: 3,
            per_node: 5,
            interval: Duration::ZERO,
        };
        let mut pipeline = Pipeline::new(attributor(3), caps);
        // Pod 0 sends to 10 ports: 3 edges kept, 7 events dropped.
        let hostile: Vec<ConnectionEvent> = (1..=10).map(|p| event(0, 100, p)).collect();
        pipeline.take_in(&hostile).unwrap();
        // Its kept edges still count repeats.
        pipeline.take_in(&[event(0, 100, 1)]).unwrap();
        // Pod 1 fits; pod 2 meets the node's cap after one edge.
        pipeline
            .take_in(&[event(1, 101, 7), event(2, 102, 7), event(2, 102, 8)])
            .unwrap();
        let flushed = pipeline.flush().unwrap();
        let mut per_pod: HashMap<String, (usize, u64)> = HashMap::new();
        for (e, o) in &flushed.edges {
            let entry = per_pod.entry(label(o)).or_default();
            entry.0 += 1;
            entry.1 += e.stats.count;
        }
        assert_eq!(per_pod["shop/pod-0"], (3, 4));
        assert_eq!(per_pod["shop/pod-1"], (1, 1));
        assert_eq!(per_pod["shop/pod-2"], (1, 1));
        assert_eq!(
            flushed.dropped,
            Dropped {
                pod_cap: 7,
                node_cap: 1
            }
        );
        // The caps start over with the next interval.
        pipeline.take_in(&[event(0, 100, 9)]).unwrap();
        let next = pipeline.flush().unwrap();
        assert_eq!(next.edges.len(), 1);
        assert_eq!(next.dropped, Dropped::default());
        assert_eq!(pipeline.dropped().total(), 8);
    }

    #[test]
    fn early_flushes_do_not_renew_the_budget_but_counted_edges_keep_flowing() {
        let caps = EdgeCaps {
            per_pod: 2,
            per_node: 100,
            interval: Duration::from_secs(3600),
        };
        let mut pipeline = Pipeline::new(attributor(1), caps);
        pipeline
            .take_in(&[event(0, 100, 1), event(0, 100, 2), event(0, 100, 3)])
            .unwrap();
        assert_eq!(pipeline.flush().unwrap().edges.len(), 2);
        // Within the same interval: the two counted edges are reported again, a new one is not.
        pipeline
            .take_in(&[event(0, 100, 1), event(0, 100, 2), event(0, 100, 4)])
            .unwrap();
        let second = pipeline.flush().unwrap();
        let ports: Vec<u16> = second.edges.iter().map(|(e, _)| e.key.port).collect();
        assert_eq!(ports, [1, 2]);
        assert_eq!(second.dropped.pod_cap, 1);
    }
}
