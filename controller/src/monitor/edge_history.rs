//! The edge history behind the protect gate (docs/behaviour.md §3.11): every flow that went through,
//! compacted to one entry per workload pair, protocol and port (first seen, last seen, count), kept
//! for a retention (default 7 days) and bounded in entries. When a policy is promoted or switched to
//! protect, [`EdgeHistory::replay`] evaluates that history against it: what it would have blocked.
//!
//! Pure: the status sync records the flows it resolves anyway and the policy reconciler asks for a
//! replay; time comes in with the flows.

use crate::learn::cluster_policies::{EdgeEnd, NamespaceEdge};
use crate::monitor::evaluate::attribution::{self, ObservedFlow, PolicyVerdict};
use crate::monitor::evaluate::compiled;
use crate::monitor::evaluate::verdict::{FlowVerdict, SideDecision};
use crate::monitor::evaluate::view::{ClusterView, Endpoint, Flow};
use crate::policy::protect_gate::{Example, GateReport};
use crate::{FastMap, FastSet};
use network_enforcer_api::{
    Direction, Protocol, ViolationRecord, WorkloadKind, WorkloadNetworkPolicy, WorkloadRef,
};
use std::cmp::Ordering;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// Examples named in a [`GateReport`], newest first.
pub const MAX_EXAMPLES: usize = 10;

/// Bounds of the history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// At most this many edges; past it the least recently seen tenth is evicted (and counted).
    pub max_edges: usize,
    /// Edges not seen for this long are forgotten.
    pub retention: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_edges: 200_000,
            retention: Duration::from_secs(7 * 86_400),
        }
    }
}

/// One end of an edge: its workload (interned: a workload is named once however many edges it has)
/// and, for ends NetworkPolicies see by address (outside peers, hostNetwork pods), that address.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Side {
    workload: Interned,
    ip: Option<IpAddr>,
}

/// A workload name from [`EdgeHistory`]'s interner, compared and hashed by identity: the interner
/// hands out one `Arc` per distinct name and forgets a name only once no edge holds it, so two
/// edges name the same workload exactly when they hold the same `Arc`. Looking an edge up then
/// hashes two pointers instead of every string of both workloads.
#[derive(Clone, Debug)]
struct Interned(Arc<WorkloadRef>);

impl PartialEq for Interned {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Interned {}

impl std::hash::Hash for Interned {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.0), state);
    }
}

impl std::ops::Deref for Interned {
    type Target = WorkloadRef;

    fn deref(&self) -> &WorkloadRef {
        &self.0
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct EdgeKey {
    source: Side,
    destination: Side,
    protocol: Protocol,
    port: u16,
    /// The name the source pod resolved an outside destination from: an address reached by name
    /// and the same address as a literal are two edges (a policy may allow one and not the other).
    peer_name: Option<Arc<str>>,
}

/// What the history keeps of an edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EdgeStats {
    pub first_seen_ms: i64,
    pub last_seen_ms: i64,
    /// Observations merged into this edge (a record's repeats count once per record).
    pub count: u64,
    /// The destination is the Kubernetes API server (the `default/kubernetes` Service's endpoints).
    pub to_api_server: bool,
}

impl EdgeStats {
    /// An edge seen once, at `at_ms`.
    fn once(at_ms: i64, to_api_server: bool) -> Self {
        EdgeStats {
            first_seen_ms: at_ms,
            last_seen_ms: at_ms,
            count: 1,
            to_api_server,
        }
    }
}

/// An edge of the history as the web view's API answers it (`check --from-cluster` reads it).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEdge {
    pub source: WorkloadRef,
    pub destination: WorkloadRef,
    pub protocol: Protocol,
    pub port: u16,
    pub first_seen_ms: i64,
    pub last_seen_ms: i64,
    pub count: u64,
    /// Which tier decides the edge's egress at its source with the policies in force now; absent
    /// when an end has no pod now (or the edge was not judged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<SideDecision>,
    /// The same for its ingress at the destination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<SideDecision>,
}

/// An edge as [`EdgeHistory::edges_in`] lists it, with its key: judged
/// ([`ListedEdge::judged`]) once the history's lock is released, so that evaluating thousands of
/// edges for a web view answer never holds up the evidence pass.
#[derive(Clone, Debug)]
pub struct ListedEdge {
    pub edge: HistoryEdge,
    key: EdgeKey,
}

impl ListedEdge {
    /// The edge with which tier decides each side in `view` (a current pod of each workload
    /// standing in for it); undecided when an end has no pod now.
    pub fn judged(mut self, view: &ClusterView) -> HistoryEdge {
        if let Some(verdict) = decide(view, &self.key) {
            self.edge.egress = Some(verdict.egress.decision());
            self.edge.ingress = Some(verdict.ingress.decision());
        }
        self.edge
    }
}

impl HistoryEdge {
    /// One flow, never seen (what `check` explains a single flow as).
    pub fn flow(
        source: WorkloadRef,
        destination: WorkloadRef,
        protocol: Protocol,
        port: u16,
    ) -> Self {
        HistoryEdge {
            source,
            destination,
            protocol,
            port,
            first_seen_ms: 0,
            last_seen_ms: 0,
            count: 0,
            egress: None,
            ingress: None,
        }
    }
}

/// An edge as it is persisted between leaders ([`crate::monitor::history_store`]): both ends with
/// the addresses NetworkPolicies see them at, the name an outside destination was resolved from, and
/// what the history keeps of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEdge {
    /// Shared with the history's own copy (an export clones no strings).
    pub source: Arc<WorkloadRef>,
    pub source_ip: Option<IpAddr>,
    pub destination: Arc<WorkloadRef>,
    pub destination_ip: Option<IpAddr>,
    pub protocol: Protocol,
    pub port: u16,
    pub peer_name: Option<String>,
    pub stats: EdgeStats,
}

/// The history (see the module docs).
#[derive(Debug)]
pub struct EdgeHistory {
    bounds: Bounds,
    /// foldhash (randomly seeded) rather than SipHash: every accepted record looks up its edge and
    /// both workload names here, and a name hashes six strings.
    edges: FastMap<EdgeKey, EdgeStats>,
    names: FastSet<Arc<WorkloadRef>>,
    /// The addresses of the names in `names`: a caller that hands in the name the history holds
    /// (the evidence pass keeps them, see [`EdgeHistory::interned`]) is found without hashing or
    /// comparing its strings. An address here is a live allocation `names` holds, so no other name
    /// can have it.
    held_at: FastSet<usize>,
    evicted: u64,
    expired: u64,
}

impl Default for EdgeHistory {
    fn default() -> Self {
        Self::new(Bounds::default())
    }
}

impl EdgeHistory {
    pub fn new(bounds: Bounds) -> Self {
        Self {
            bounds,
            edges: FastMap::default(),
            names: FastSet::default(),
            held_at: FastSet::default(),
            evicted: 0,
            expired: 0,
        }
    }

    /// Adds one observation of `flow` (its `seen_at` is the time); `to_api_server` as [`EdgeStats`].
    pub fn record(&mut self, flow: &ObservedFlow, to_api_server: bool) {
        let at = flow.seen_at.0.as_millisecond();
        let key = EdgeKey {
            source: self.side(&flow.source.workload, &flow.source.endpoint),
            destination: self.side(&flow.destination.workload, &flow.destination.endpoint),
            protocol: flow.protocol,
            port: flow.port,
            peer_name: flow.peer_name.clone(),
        };
        if let Some(stats) = self.edges.get_mut(&key) {
            stats.first_seen_ms = stats.first_seen_ms.min(at);
            stats.last_seen_ms = stats.last_seen_ms.max(at);
            stats.count = stats.count.saturating_add(1);
            stats.to_api_server |= to_api_server;
            return;
        }
        self.insert_new(key, EdgeStats::once(at, to_api_server));
    }

    /// Adds an edge the history does not hold, within the bound.
    fn insert_new(&mut self, key: EdgeKey, stats: EdgeStats) {
        if self.edges.len() >= self.bounds.max_edges.max(1) {
            self.evict_oldest();
        }
        self.edges.insert(key, stats);
    }

    /// Adds the flow a violation record of a policy's status names, unless the history holds its
    /// edge already: what a controller that has just become the leader knows of the traffic before
    /// its agents report it again (docs/behaviour.md §3.11). The record's time is its last seen; an
    /// end with an address is seen by address. Returns whether an edge was added.
    pub fn seed(&mut self, record: &ViolationRecord) -> bool {
        let Some(port) = record.dst_port.and_then(|p| u16::try_from(p).ok()) else {
            return false;
        };
        let at = record.timestamp.0.as_millisecond();
        let (source, destination) = (
            Arc::new(record.source.clone()),
            Arc::new(record.dest.clone()),
        );
        let key = EdgeKey {
            source: self.side_at(&source, source.address.parse().ok()),
            destination: self.side_at(&destination, destination.address.parse().ok()),
            protocol: record.protocol,
            port,
            peer_name: Some(record.dest.dns_name.as_str())
                .filter(|n| !n.is_empty())
                .map(Arc::from),
        };
        if self.edges.contains_key(&key) {
            self.drop_unused_names();
            return false;
        }
        self.insert_new(key, EdgeStats::once(at, false));
        true
    }

    /// Every edge, most recently seen first: what a leader persists, the newest first so that a
    /// bound on the persisted size cuts the oldest. Ties are ordered by the interned names' addresses:
    /// the same history exports in the same order (so an unchanged history encodes to the same
    /// bytes and is not written again) without comparing strings.
    pub fn export(&self) -> Vec<StoredEdge> {
        let mut edges: Vec<StoredEdge> = self
            .edges
            .iter()
            .map(|(k, s)| StoredEdge {
                source: Arc::clone(&k.source.workload.0),
                source_ip: k.source.ip,
                destination: Arc::clone(&k.destination.workload.0),
                destination_ip: k.destination.ip,
                protocol: k.protocol,
                port: k.port,
                peer_name: k.peer_name.as_deref().map(str::to_string),
                stats: *s,
            })
            .collect();
        let tie = |e: &StoredEdge| {
            (
                Arc::as_ptr(&e.source) as usize,
                e.source_ip,
                Arc::as_ptr(&e.destination) as usize,
                e.destination_ip,
                e.protocol,
                e.port,
            )
        };
        edges.sort_unstable_by(|a, b| {
            b.stats
                .last_seen_ms
                .cmp(&a.stats.last_seen_ms)
                .then_with(|| tie(a).cmp(&tie(b)))
                .then_with(|| a.peer_name.cmp(&b.peer_name))
        });
        edges
    }

    /// Takes in edges a previous leader persisted (docs/behaviour.md §3.11): an edge the history
    /// holds already keeps the earliest first and the latest last seen of both, and the larger
    /// count (the same observations may be in both); the bounds apply as to any new edge. Returns
    /// how many edges were added.
    pub fn restore(&mut self, edges: impl IntoIterator<Item = StoredEdge>) -> usize {
        let mut added = 0;
        for edge in edges {
            let (source, destination) = (edge.source, edge.destination);
            let key = EdgeKey {
                source: self.side_at(&source, edge.source_ip),
                destination: self.side_at(&destination, edge.destination_ip),
                protocol: edge.protocol,
                port: edge.port,
                peer_name: edge.peer_name.map(Arc::from),
            };
            let stored = edge.stats;
            if let Some(stats) = self.edges.get_mut(&key) {
                stats.first_seen_ms = stats.first_seen_ms.min(stored.first_seen_ms);
                stats.last_seen_ms = stats.last_seen_ms.max(stored.last_seen_ms);
                stats.count = stats.count.max(stored.count);
                stats.to_api_server |= stored.to_api_server;
                continue;
            }
            self.insert_new(key, stored);
            added += 1;
        }
        self.drop_unused_names();
        added
    }

    fn side(&mut self, workload: &Arc<WorkloadRef>, endpoint: &Endpoint) -> Side {
        let ip = match endpoint {
            Endpoint::Ip(ip) => Some(*ip),
            Endpoint::Pod(_) => None,
        };
        self.side_at(workload, ip)
    }

    /// The side of `workload`, seen at `ip` when NetworkPolicies see it by address.
    fn side_at(&mut self, workload: &Arc<WorkloadRef>, ip: Option<IpAddr>) -> Side {
        let workload = if self.held_at.contains(&(Arc::as_ptr(workload) as usize)) {
            Interned(Arc::clone(workload))
        } else {
            match self.names.get(&**workload) {
                Some(name) => Interned(Arc::clone(name)),
                None => {
                    self.names.insert(Arc::clone(workload));
                    self.held_at.insert(Arc::as_ptr(workload) as usize);
                    Interned(Arc::clone(workload))
                }
            }
        };
        Side { workload, ip }
    }

    /// Evicts the least recently seen tenth (at least one edge): amortised, one sort per tenth of
    /// the bound rather than a scan per insert.
    fn evict_oldest(&mut self) {
        let mut seen: Vec<i64> = self.edges.values().map(|s| s.last_seen_ms).collect();
        let n = (seen.len() / 10).max(1);
        let (_, cut, _) = seen.select_nth_unstable(n - 1);
        let cut = *cut;
        let mut left = n;
        self.edges.retain(|_, s| {
            let evict = left > 0 && s.last_seen_ms <= cut;
            left -= usize::from(evict);
            !evict
        });
        self.evicted += (n - left) as u64;
        self.drop_unused_names();
    }

    /// Forgets edges last seen before `now_ms` − retention.
    pub fn forget_expired(&mut self, now_ms: i64) {
        let retention = i64::try_from(self.bounds.retention.as_millis()).unwrap_or(i64::MAX);
        let before = now_ms.saturating_sub(retention);
        let len = self.edges.len();
        self.edges.retain(|_, s| s.last_seen_ms >= before);
        let gone = len - self.edges.len();
        if gone > 0 {
            self.expired += gone as u64;
            self.drop_unused_names();
        }
    }

    fn drop_unused_names(&mut self) {
        let held_at = &mut self.held_at;
        self.names.retain(|name| {
            let used = Arc::strong_count(name) > 1;
            if !used {
                held_at.remove(&(Arc::as_ptr(name) as usize));
            }
            used
        });
    }

    /// The history's own copy of `name`, if an edge names it: handing that copy to
    /// [`EdgeHistory::record`] later spares comparing the name's strings.
    pub fn interned(&self, name: &WorkloadRef) -> Option<Arc<WorkloadRef>> {
        self.names.get(name).cloned()
    }

    /// Edges held now.
    pub fn len(&self) -> usize {
        self.edges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.edges.is_empty()
    }

    /// Edges evicted by the bound so far (`edge_history_evicted_total`).
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Edges forgotten after the retention so far.
    pub fn expired(&self) -> u64 {
        self.expired
    }

    /// The stats of the edge `source → destination` on `protocol`/`port`, if held (tests, `check`).
    pub fn stats(
        &self,
        source: &WorkloadRef,
        destination: &WorkloadRef,
        protocol: Protocol,
        port: u16,
    ) -> Option<EdgeStats> {
        self.edges
            .iter()
            .find(|(k, _)| {
                *k.source.workload == *source
                    && *k.destination.workload == *destination
                    && k.protocol == protocol
                    && k.port == port
            })
            .map(|(_, s)| *s)
    }

    /// The edges with an end in `namespace`, most recently seen first, at most `limit`; and whether
    /// more were left out.
    pub fn edges_in(&self, namespace: &str, limit: usize) -> (Vec<ListedEdge>, bool) {
        let in_namespace =
            |side: &Side| side.workload.address.is_empty() && side.workload.namespace == namespace;
        let mut hits: Vec<(&EdgeKey, &EdgeStats)> = self
            .edges
            .iter()
            .filter(|(k, _)| in_namespace(&k.source) || in_namespace(&k.destination))
            .collect();
        fn newest_first(a: &(&EdgeKey, &EdgeStats), b: &(&EdgeKey, &EdgeStats)) -> Ordering {
            // Every part of the key but the addresses: the same history answers in the same order.
            fn names(k: &EdgeKey) -> (&WorkloadRef, &WorkloadRef, u16, Protocol, Option<&str>) {
                let (source, destination) = (&k.source.workload.0, &k.destination.workload.0);
                (
                    source,
                    destination,
                    k.port,
                    k.protocol,
                    k.peer_name.as_deref(),
                )
            }
            (b.1.last_seen_ms.cmp(&a.1.last_seen_ms)).then_with(|| names(a.0).cmp(&names(b.0)))
        }
        // Only what is answered is sorted and copied: the web view's graph asks every 2 s.
        let truncated = hits.len() > limit;
        if truncated {
            hits.select_nth_unstable_by(limit, newest_first);
            hits.truncate(limit);
        }
        hits.sort_by(newest_first);
        let edges = hits
            .into_iter()
            .map(|(k, s)| ListedEdge {
                edge: HistoryEdge {
                    count: s.count,
                    first_seen_ms: s.first_seen_ms,
                    last_seen_ms: s.last_seen_ms,
                    ..HistoryEdge::flow(
                        (*k.source.workload).clone(),
                        (*k.destination.workload).clone(),
                        k.protocol,
                        k.port,
                    )
                },
                key: k.clone(),
            })
            .collect();
        (edges, truncated)
    }

    /// Evaluates every edge on `policy`'s side against it, as if it were rendered, with `view`'s pods
    /// and NetworkPolicies (see the module docs). Pods stand in for their workloads: the newest pods
    /// of a workload are evaluated, as the live path does for Service backends.
    pub fn replay(&self, view: &ClusterView, policy: &WorkloadNetworkPolicy) -> GateReport {
        let namespace = policy.metadata.namespace.as_deref().unwrap_or_default();
        let target = &policy.spec.target_ref;
        let is_target = |w: &WorkloadRef| {
            w.address.is_empty()
                && w.namespace == namespace
                && w.owner_name == target.name
                && w.owner_kind == target.kind.as_str()
        };
        let mut report = GateReport::default();
        let mut blocked: Vec<(&EdgeKey, &EdgeStats)> = Vec::new();
        for (key, stats) in &self.edges {
            let ours = match policy.spec.direction {
                Direction::Egress => &key.source,
                Direction::Ingress => &key.destination,
            };
            if !is_target(&ours.workload) {
                continue;
            }
            report.considered += 1;
            let (Some(source), Some(destination)) = (
                endpoint(view, &key.source),
                endpoint(view, &key.destination),
            ) else {
                report.not_evaluable += 1;
                continue;
            };
            let flow = Flow {
                source,
                destination,
                protocol: key.protocol,
                port: key.port,
            };
            let principal = Some(key.source.workload.identity.as_str()).filter(|p| !p.is_empty());
            let peer_name = key.peer_name.as_deref();
            // A flow the cluster stops at its source never reaches an ingress policy.
            if policy.spec.direction == Direction::Ingress
                && attribution::stopped_at_source(view, &flow).unwrap_or(false)
            {
                continue;
            }
            match attribution::policy_verdict(view, policy, &flow, principal, peer_name) {
                Ok(PolicyVerdict::Denies) => blocked.push((key, stats)),
                Ok(PolicyVerdict::Allows | PolicyVerdict::NotApplicable) => {}
                Err(_) => report.not_evaluable += 1,
            }
        }
        report.would_block = blocked.len();
        report.cuts_dns = blocked.iter().any(|(k, _)| is_dns(k));
        report.cuts_api_server = blocked.iter().any(|(_, s)| s.to_api_server);
        blocked.sort_by(|a, b| {
            b.1.last_seen_ms
                .cmp(&a.1.last_seen_ms)
                .then_with(|| a.0.port.cmp(&b.0.port))
        });
        report.examples = blocked
            .iter()
            .take(MAX_EXAMPLES)
            .map(|(key, stats)| {
                let peer = match policy.spec.direction {
                    Direction::Egress => &key.destination,
                    Direction::Ingress => &key.source,
                };
                Example {
                    peer: name_of(&peer.workload),
                    protocol: key.protocol,
                    port: key.port,
                    last_seen_ms: stats.last_seen_ms,
                }
            })
            .collect();
        report
    }
}

/// What the policies in force in `view` say about the edge `key` (a current pod of each workload
/// standing in for it); `None` when an end has no pod now.
fn decide(view: &ClusterView, key: &EdgeKey) -> Option<FlowVerdict> {
    let flow = Flow {
        source: endpoint(view, &key.source)?,
        destination: endpoint(view, &key.destination)?,
        protocol: key.protocol,
        port: key.port,
    };
    compiled::evaluate(view, &flow).ok()
}

/// Where the evaluators find an end now: its address, or a current pod of its workload.
fn endpoint(view: &ClusterView, side: &Side) -> Option<Endpoint> {
    if let Some(ip) = side.ip {
        return Some(Endpoint::Ip(ip));
    }
    let w = &side.workload;
    let kind = WorkloadKind::from_kind(&w.owner_kind)?;
    let pod = view.pods_of(&w.namespace, kind, &w.owner_name).next()?;
    Some(Endpoint::Pod(pod.key()))
}

/// DNS: port 53 to a workload of kube-system (CoreDNS, kube-dns, NodeLocal DNSCache).
fn is_dns(key: &EdgeKey) -> bool {
    key.port == 53 && key.destination.workload.namespace == "kube-system"
}

/// `ns/Kind/name`, or the address of a peer that is no workload, after the name the pod resolved
/// it from when it did (`api.example.test (203.0.113.10)`: the name is what `egressNames` lists).
pub fn name_of(w: &WorkloadRef) -> String {
    if w.address.is_empty() {
        format!("{}/{}/{}", w.namespace, w.owner_kind, w.owner_name)
    } else if w.dns_name.is_empty() {
        w.address.clone()
    } else {
        format!("{} ({})", w.dns_name, w.address)
    }
}

/// The namespace graph of the protect gate's history (what the leader learns cluster proposals from,
/// [`crate::learn::cluster_policies::NamespaceGraph`]): one edge per source namespace and destination namespace or
/// address, sorted. A source seen by address (a hostNetwork pod, an outside client) has no namespace
/// a policy could select; a destination seen by address (outside, a node, a hostNetwork pod) is an
/// address, as ClusterNetworkPolicy `networks` see it.
pub fn namespace_edges(edges: &[StoredEdge]) -> Vec<NamespaceEdge> {
    let mut out: std::collections::BTreeSet<NamespaceEdge> = Default::default();
    for edge in edges {
        if edge.source_ip.is_some() || edge.source.namespace.is_empty() {
            continue;
        }
        let to = match edge.destination_ip {
            Some(ip) => EdgeEnd::Address(ip),
            None if !edge.destination.namespace.is_empty() => {
                EdgeEnd::Namespace(edge.destination.namespace.clone())
            }
            None => continue,
        };
        out.insert(NamespaceEdge {
            from: edge.source.namespace.clone(),
            to,
        });
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests;
