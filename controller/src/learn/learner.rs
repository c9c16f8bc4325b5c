//! The learner: what the controller has learned and not written yet (docs/behaviour.md §1.3, §1.8 to
//! §1.10). Pure in-memory state, no API calls: the [`crate::learn::flusher::Flusher`] takes its pending
//! edges and hands them to the [`crate::learn::proposal_writer::ProposalWriter`].
//!
//! Agents report the same connection many times (both ends, every replica, every window). An
//! observation is resolved against the index ([`learn::flows()`]), turned into proposal edges
//! ([`learn::edges()`]) and merged per proposal into [`PendingEdges`], a hash set kept in arrival order.
//! Ingest hands it what records teach through [`ObservationSink`], resolved once (now, or after
//! waiting for the index: [`crate::ingest::waiting`]). External peers are capped per
//! proposal and port ([`DEFAULT_MAX_EXTERNAL_PEERS`]): past the cap they are counted
//! (`resolutions_total{outcome="external_capped"}`) and reported with the proposal's write, never
//! silently widened to a larger CIDR. The learner remembers which edges it has seen (a new one wakes
//! the flusher, [`Learner::new_edges`]) and which a flush has decided (a batch of only those needs no
//! flush before its acknowledgement, [`WaitsFor`]).

use crate::cluster::index::{FlowEnd, Flows, Index, NoFlow};
use crate::ingest::ledger::WaitsFor;
use crate::ingest::reported::ObservationSink;
use crate::learn::{self, Edge, ReportedConnection, Target, WorkloadFlow};
use crate::runtime::metrics::{ControllerMetrics, PeerKind};
use crate::{FastMap, FastSet};
use network_enforcer_api::{Backend, Protocol, WorkloadKind};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::BuildHasher as _;
use std::sync::Mutex;

/// Default cap on distinct external addresses learned per proposal and (protocol, port)
/// (`--max-external-peers-per-port`).
pub const DEFAULT_MAX_EXTERNAL_PEERS: usize = 50;

/// What an observation resolves to.
pub type Resolution = Result<Vec<WorkloadFlow>, NoFlow>;

/// What [`PendingEdges::add`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Added {
    New,
    /// Already pending.
    Known,
    /// Refused: the port's pending external addresses are at the cap.
    Capped,
    /// Refused: the proposal has [`MAX_PENDING_EDGES`] pending already.
    Overflow,
}

/// The most edges one proposal keeps pending between two flushes. Agents report an active edge again
/// in later windows, so one refused now is learned after the flush has made room; the bound keeps a
/// workload reaching huge numbers of peers or ports from growing the controller's memory.
pub const MAX_PENDING_EDGES: usize = 20_000;

/// The edges waiting for one proposal's next write.
#[derive(Debug, Default)]
pub struct PendingEdges {
    /// Each edge with its arrival number (the write keeps arrival order: rules appear as first seen).
    edges: HashMap<Edge, u32>,
    /// External edges pending per (protocol, port), for the cap.
    external: HashMap<(Protocol, u16), usize>,
    /// External edges refused by the cap per (protocol, port), for the proposal's Event at the write.
    capped: BTreeMap<(Protocol, u16), usize>,
    /// Edges refused because [`MAX_PENDING_EDGES`] were pending.
    overflow: usize,
    /// Whether an edge came in that no flush had decided (written, or refused for good): an
    /// acknowledgement may wait for this proposal's next write. Without one, every edge here repeats
    /// what the proposal holds already, and the write can wait for the regular flush
    /// ([`Learner::take_undecided`]).
    undecided: bool,
}

impl PendingEdges {
    /// Adds `edge` unless it is already pending or would take its port's pending external addresses
    /// past `max_external`.
    pub fn add(&mut self, edge: Edge, max_external: usize) -> Added {
        if self.edges.contains_key(&edge) {
            return Added::Known;
        }
        if self.edges.len() >= MAX_PENDING_EDGES {
            self.overflow += 1;
            return Added::Overflow;
        }
        if edge.external().is_some() {
            let count = self.external.entry(edge.port()).or_default();
            if *count >= max_external {
                *self.capped.entry(edge.port()).or_default() += 1;
                return Added::Capped;
            }
            *count += 1;
        }
        let n = self.edges.len() as u32;
        self.edges.insert(edge, n);
        Added::New
    }

    /// Number of edges.
    pub fn len(&self) -> usize {
        self.edges.len()
    }

    /// Whether an acknowledgement may wait for these edges' write (see `undecided`).
    pub fn undecided(&self) -> bool {
        self.undecided
    }

    /// Whether no edge is pending.
    pub fn is_empty(&self) -> bool {
        self.edges.is_empty()
    }

    /// External edges refused by the cap since this was created, per (protocol, port).
    pub fn capped(&self) -> &BTreeMap<(Protocol, u16), usize> {
        &self.capped
    }

    /// Edges refused because [`MAX_PENDING_EDGES`] were pending.
    pub fn overflow(&self) -> usize {
        self.overflow
    }

    /// The edges in arrival order.
    pub fn into_ordered(self) -> Vec<Edge> {
        let mut edges: Vec<(Edge, u32)> = self.edges.into_iter().collect();
        edges.sort_unstable_by_key(|(_, n)| *n);
        edges.into_iter().map(|(e, _)| e).collect()
    }
}

/// A workload excluded from learning (`--exclude-workload namespace/kind/name`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ExcludedWorkload {
    pub namespace: String,
    /// Lowercase kind: `deployment`, `statefulset`, `daemonset`, `cronjob`, `job`, `pod`.
    pub kind: String,
    pub name: String,
}

impl std::str::FromStr for ExcludedWorkload {
    type Err = String;

    /// `namespace/kind/name`, kind case-insensitive (`shop/Deployment/web`).
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split('/').collect();
        let [namespace, kind, name] = parts.as_slice() else {
            return Err(format!(
                "{s:?}: expected namespace/kind/name, e.g. shop/deployment/web"
            ));
        };
        let kind = kind.to_ascii_lowercase();
        let kinds: Vec<String> = WorkloadKind::ALL
            .iter()
            .map(|k| k.as_str().to_ascii_lowercase())
            .collect();
        if !kinds.contains(&kind) {
            return Err(format!(
                "{s:?}: kind {kind:?} is not one of {}",
                kinds.join(", ")
            ));
        }
        if namespace.is_empty() || name.is_empty() {
            return Err(format!("{s:?}: namespace and name must not be empty"));
        }
        Ok(Self {
            namespace: namespace.to_string(),
            kind,
            name: name.to_string(),
        })
    }
}

/// See the module docs.
pub struct Learner {
    backend: Backend,
    excluded_namespaces: BTreeSet<String>,
    excluded_workloads: BTreeSet<ExcludedWorkload>,
    /// Learns for this namespace only (`--namespace`/`WATCH_NAMESPACE`); `None`: every namespace.
    only_namespace: Option<String>,
    /// foldhash (randomly seeded): every learned edge looks its proposal up here.
    pending: Mutex<FastMap<Target, PendingEdges>>,
    limits: learn::Limits,
    metrics: ControllerMetrics,
    /// Lets an agent teach its peers' proposals even when they have no pod on its node
    /// (`--trust-remote-peers`; see [`learn::Reporter::Node`]).
    trust_remote_peers: bool,
    /// Edges merged before, by hash of (proposal, edge), bounded by [`SEEN_EDGES`]: a new one wakes
    /// the flusher ([`Learner::new_edges`]) so it is written without waiting for the tick.
    seen: Mutex<FastSet<u64>>,
    /// Edges a flush has decided (written, or refused for good), by the same hash, bounded by
    /// [`SEEN_EDGES`]: a record of only these waits for no flush, so its acknowledgement goes at once.
    decided: Mutex<FastSet<u64>>,
    /// Hashes proposals ([`Learner::proposal_key`]) and their edges ([`Learner::edge_key`]). SipHash:
    /// the keys stand for the values in `seen` and `decided`, so they must not collide.
    seen_hasher: std::hash::RandomState,
    new_edges: tokio::sync::Notify,
}

/// How many (proposal, edge) pairs the learner remembers to tell new edges from repeats; when full it
/// starts over (every edge then looks new once: early flushes that write nothing new).
pub const SEEN_EDGES: usize = 262_144;

impl Learner {
    /// A learner for `backend` that learns nothing for workloads in `excluded_namespaces` (they are
    /// still resolved as peers of others).
    pub fn new(backend: Backend, excluded_namespaces: BTreeSet<String>) -> Self {
        Self {
            backend,
            excluded_namespaces,
            excluded_workloads: BTreeSet::new(),
            only_namespace: None,
            pending: Mutex::new(FastMap::default()),
            limits: learn::Limits::default(),
            metrics: ControllerMetrics::new(),
            trust_remote_peers: false,
            seen: Mutex::new(FastSet::default()),
            decided: Mutex::new(FastSet::default()),
            seen_hasher: std::hash::RandomState::new(),
            new_edges: tokio::sync::Notify::new(),
        }
    }

    /// Notified when an edge no earlier observation produced is pending: the flusher writes soon
    /// instead of at its next tick ([`crate::learn::flusher`]).
    pub fn new_edges(&self) -> &tokio::sync::Notify {
        &self.new_edges
    }

    /// Learns nothing for these workloads either (they are still resolved as peers of others).
    pub fn with_excluded_workloads(
        mut self,
        workloads: impl IntoIterator<Item = ExcludedWorkload>,
    ) -> Self {
        self.excluded_workloads.extend(workloads);
        self
    }

    /// Learns at most `max` distinct external addresses per proposal and (protocol, port); past that,
    /// further ones are counted, logged and reported with an Event instead (`0`: no external peer is
    /// learned).
    pub fn with_max_external_peers(mut self, max: usize) -> Self {
        self.limits.max_external_peers = max;
        self
    }

    /// Holds at most `max` port entries per rule (runs of consecutive ports collapse into ranges
    /// first); further ports are counted, logged and reported with an Event.
    pub fn with_max_ports_per_rule(mut self, max: usize) -> Self {
        self.limits.max_ports_per_rule = max.max(1);
        self
    }

    /// Holds at most `max` rules (peers) per proposal; further peers are counted, logged and reported
    /// with an Event.
    pub fn with_max_rules(mut self, max: usize) -> Self {
        self.limits.max_rules = max.max(1);
        self
    }

    /// Proposes `*.<parent>` for `min` sibling names on one port ([`crate::learn::wildcards`]); 0:
    /// never.
    pub fn with_wildcard_min_names(mut self, min: usize) -> Self {
        self.limits.wildcard_min_names = min;
        self
    }

    /// Learns for workloads in `namespace` only (a controller that watches one namespace must not
    /// write proposals elsewhere: its agents report the whole node). Peers elsewhere still resolve.
    pub fn with_only_namespace(mut self, namespace: Option<String>) -> Self {
        self.only_namespace = namespace;
        self
    }

    /// Lets an agent's report teach the peer's proposal even when the peer's workload has no pod on
    /// the agent's node (see [`learn::Reporter::Node`]): for clusters whose agents do not all report.
    pub fn with_trust_remote_peers(mut self, trust: bool) -> Self {
        self.trust_remote_peers = trust;
        self
    }

    /// Counts into `metrics` (the process's registry) instead of a private one. The ingest counts into
    /// the same metrics through [`Learner::metrics`].
    pub fn with_metrics(mut self, metrics: ControllerMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The metrics this learner (and the ingest and writer around it) counts into.
    pub fn metrics(&self) -> &ControllerMetrics {
        &self.metrics
    }

    /// The limits a proposal's write merges within.
    pub fn limits(&self) -> &learn::Limits {
        &self.limits
    }

    fn excluded(&self, target: &Target) -> bool {
        // No allocation: this runs for every edge of every record.
        self.only_namespace
            .as_ref()
            .is_some_and(|only| *only != target.workload.namespace)
            || self
                .excluded_namespaces
                .contains(&target.workload.namespace)
            || self.excluded_workloads.iter().any(|w| {
                w.namespace == target.workload.namespace
                    && w.name == target.workload.name
                    && w.kind.eq_ignore_ascii_case(target.kind.as_str())
            })
    }

    /// Adds what `obs` teaches to the pending edges; returns how many edges it produced.
    pub fn observe(&self, index: &Index, obs: &ReportedConnection) -> Result<usize, NoFlow> {
        self.merge(
            index,
            obs,
            learn::flows(index, obs),
            &mut WaitsFor::default(),
        )
    }

    /// The key of `target`'s proposal in [`WaitsFor`] and [`crate::learn::flush_report::FlushReport::failed_proposals`].
    pub fn proposal_key(&self, target: &Target) -> u64 {
        self.seen_hasher.hash_one(target)
    }

    /// The key of `edge` of the proposal keyed `proposal` in `seen` and `decided`. From the proposal's
    /// key rather than the proposal itself: a proposal names its workload in full (selector
    /// included), and every learned edge needs both keys.
    fn edge_key(&self, proposal: u64, edge: &Edge) -> u64 {
        self.seen_hasher.hash_one((proposal, edge))
    }

    /// Adds the flows `obs` resolved to the pending edges; counts an unresolved one. Returns how many
    /// of its edges a flush has yet to decide (0: its acknowledgement need not wait), and adds their
    /// proposals to `waits`.
    pub fn merge(
        &self,
        index: &Index,
        obs: &ReportedConnection,
        flows: Resolution,
        waits: &mut WaitsFor,
    ) -> Result<usize, NoFlow> {
        let mut produced = 0;
        let flows = flows.inspect_err(|e| self.metrics.resolved(e.label(), 1))?;
        // The node whose agent reported this, when it may speak only for its own pods.
        let reporting_node = match obs.reporter {
            learn::Reporter::Node if !self.trust_remote_peers => obs.local.node.as_deref(),
            _ => None,
        };
        let (mut added, mut capped) = (0i64, 0u64);
        let mut fresh = false;
        let mut pending = self.pending.lock().expect("pending edges lock");
        for flow in flows {
            // The peer is the side that is not the local pod's workload.
            let peer = match obs.opened {
                learn::Opened::Outbound => &flow.destination,
                learn::Opened::Inbound => &flow.source,
            };
            self.metrics.resolved_peer(match peer {
                FlowEnd::Workload(_) => PeerKind::Workload,
                FlowEnd::HostNetwork { .. } => PeerKind::HostNetwork,
                FlowEnd::Node { .. } => PeerKind::Node,
                FlowEnd::External(_) => PeerKind::External,
            });
            if learn::has_unselectable_side(&flow) {
                self.metrics.resolved("unselectable_workload", 1);
            }
            for (target, edge) in learn::edges(&flow, self.backend) {
                if self.excluded(&target) {
                    continue;
                }
                if let Some(node) = reporting_node
                    && learn::is_peer_side(obs.opened, target.direction)
                    && !index.has_pod_on(&target.workload, node)
                {
                    // The peer's own node reports this connection from its side.
                    self.metrics.resolved("peer_elsewhere_not_taught", 1);
                    continue;
                }
                let proposal = self.proposal_key(&target);
                let hash = self.edge_key(proposal, &edge);
                // A decided edge is still merged again at the next regular flush (a no-op unless the
                // proposal lost it), but no acknowledgement waits for it.
                let undecided = !self
                    .decided
                    .lock()
                    .expect("decided edges lock")
                    .contains(&hash);
                if undecided {
                    produced += 1;
                    waits.add(proposal);
                }
                let edges = match pending.get_mut(&target) {
                    Some(edges) => edges,
                    None => pending.entry(target).or_default(),
                };
                edges.undecided |= undecided;
                match edges.add(edge, self.limits.max_external_peers) {
                    Added::New => {
                        added += 1;
                        let mut seen = self.seen.lock().expect("seen edges lock");
                        if seen.len() >= SEEN_EDGES {
                            seen.clear();
                        }
                        fresh |= seen.insert(hash);
                    }
                    Added::Known => {}
                    Added::Capped => capped += 1,
                    // Counted and reported with the proposal's write.
                    Added::Overflow => {}
                }
            }
        }
        if added > 0 {
            self.metrics.pending_edges.inc_by(added);
            self.metrics.pending_proposals.set(pending.len() as i64);
        }
        if fresh {
            self.new_edges.notify_one();
        }
        if capped > 0 {
            // Reported with the proposal's Event when the pending ones are written.
            self.metrics.resolved("external_capped", capped);
        }

        Ok(produced)
    }

    /// Number of proposals with edges waiting to be written.
    pub fn pending_proposals(&self) -> usize {
        self.pending.lock().expect("pending edges lock").len()
    }

    /// Takes every pending edge, by proposal, for a flush.
    pub fn take_pending(&self) -> FastMap<Target, PendingEdges> {
        std::mem::take(&mut *self.pending.lock().expect("pending edges lock"))
    }

    /// Takes the pending edges of the proposals that hold an edge no flush has decided yet
    /// ([`PendingEdges::undecided`]): every edge an acknowledgement waits for. The others only repeat
    /// what their proposals hold; they stay for the next [`Learner::take_pending`]. A flush woken by
    /// new edges writes these alone: rewriting every proposal an agent repeats (a read each)
    /// would make that flush, and the acknowledgements waiting for it, as slow as a regular one.
    pub fn take_undecided(&self) -> FastMap<Target, PendingEdges> {
        let mut pending = self.pending.lock().expect("pending edges lock");
        let (undecided, repeats) = std::mem::take(&mut *pending)
            .into_iter()
            .partition(|(_, edges)| edges.undecided);
        *pending = repeats;
        undecided
    }

    /// Remembers that a flush decided `edges` of `target` (wrote them, or refused them for good).
    pub fn decided(&self, target: &Target, edges: &[Edge]) {
        let mut known = self.decided.lock().expect("decided edges lock");
        if known.len() + edges.len() > SEEN_EDGES {
            known.clear();
        }
        let proposal = self.proposal_key(target);
        known.extend(edges.iter().map(|e| self.edge_key(proposal, e)));
    }

    /// Puts back the edges of a write that failed, for the next flush.
    pub fn keep_for_retry(&self, target: Target, edges: Vec<Edge>) {
        let mut pending = self.pending.lock().expect("pending edges lock");
        let kept = pending.entry(target).or_default();
        // Acknowledgements wait for them.
        kept.undecided = true;
        for e in edges {
            // Kept edges already passed the cap once; only the merge decides again.
            let _ = kept.add(e, usize::MAX);
        }
    }

    /// Brings the pending gauges up to date (after a flush).
    pub fn count_pending(&self) {
        let pending = self.pending.lock().expect("pending edges lock");
        self.metrics.pending_proposals.set(pending.len() as i64);
        self.metrics
            .pending_edges
            .set(pending.values().map(PendingEdges::len).sum::<usize>() as i64);
    }
}

impl ObservationSink for Learner {
    fn learn(
        &self,
        index: &Index,
        obs: &ReportedConnection,
        flows: Result<Flows, NoFlow>,
        waits: &mut WaitsFor,
    ) -> Result<usize, NoFlow> {
        self.merge(index, obs, learn::workload_flows(flows, obs), waits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bare_pod(namespace: &str, name: &str, ip: &str) -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": namespace, "name": name, "uid": format!("uid-{name}"),
                         "labels": {"app": name}},
            "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running", "podIP": ip}
        }))
        .unwrap()
    }

    /// A connection to pod `namespace/local`, as ingest found that pod in `index`.
    fn inbound(index: &Index, namespace: &str, local: &str, peer: &str) -> ReportedConnection {
        ReportedConnection {
            local: index.pod(namespace, local).expect("indexed").clone(),
            peer: peer.parse().unwrap(),
            port: 8080,
            protocol: Protocol::TCP,
            opened: learn::Opened::Inbound,
            at_ms: 0,
            reporter: learn::Reporter::Node,
            peer_name: Default::default(),
        }
    }

    /// Learns `obs` as the index resolves it now (as ingest does when nothing waits).
    fn learn_now(
        learner: &Learner,
        index: &Index,
        obs: &ReportedConnection,
        waits: &mut WaitsFor,
    ) -> Result<usize, NoFlow> {
        learner.learn(index, obs, index.flows(&obs.connection()), waits)
    }

    fn learner() -> Learner {
        Learner::new(Backend::Kubernetes, BTreeSet::new())
    }

    fn pending_names(learner: &Learner) -> BTreeSet<String> {
        let pending = learner.pending.lock().unwrap();
        pending
            .keys()
            .map(|t| format!("{}/{}", t.workload.namespace, t.name()))
            .collect()
    }

    fn names(pending: &FastMap<Target, PendingEdges>) -> BTreeSet<String> {
        pending.keys().map(Target::name).collect()
    }

    #[test]
    fn a_flush_for_new_edges_takes_only_the_proposals_an_acknowledgement_waits_for() {
        let learner = learner();
        let mut index = Index::default();
        for (name, ip) in [("api", "10.0.0.2"), ("web", "10.0.0.5"), ("db", "10.0.0.7")] {
            index.apply_pod(&bare_pod("shop", name, ip), 0);
        }
        // web → api is learned and written: its edges are decided.
        let web_to_api = inbound(&index, "shop", "api", "10.0.0.5");
        let mut waits = WaitsFor::default();
        learn_now(&learner, &index, &web_to_api, &mut waits).unwrap();
        assert!(!waits.is_nothing());
        for (target, edges) in learner.take_pending() {
            learner.decided(&target, &edges.into_ordered());
        }

        // Repeated, it waits for no write; web → db is new.
        let mut waits = WaitsFor::default();
        learn_now(&learner, &index, &web_to_api, &mut waits).unwrap();
        assert!(waits.is_nothing(), "{waits:?}");
        let mut waits = WaitsFor::default();
        learn_now(
            &learner,
            &index,
            &inbound(&index, "shop", "db", "10.0.0.5"),
            &mut waits,
        )
        .unwrap();
        assert!(!waits.is_nothing());

        // The flush for new edges writes db's ingress and web's egress (which gained db); api's
        // ingress only repeats a written edge and waits for the regular flush.
        assert_eq!(
            names(&learner.take_undecided()),
            BTreeSet::from(["pod-db-ingress".to_string(), "pod-web-egress".to_string()])
        );
        assert_eq!(
            names(&learner.take_pending()),
            BTreeSet::from(["pod-api-ingress".to_string()])
        );

        // A failed write's edges are put back as undecided: the acknowledgements still wait for them.
        let target = learn_now(&learner, &index, &web_to_api, &mut WaitsFor::default())
            .map(|_| learner.take_pending().into_keys().next().unwrap())
            .unwrap();
        learner.keep_for_retry(target, vec![]);
        assert_eq!(names(&learner.take_undecided()).len(), 1);
    }

    #[test]
    fn a_peer_whose_ip_the_index_learns_late_waits_and_is_learned_as_its_pod() {
        let learner = learner().with_only_namespace(Some("shop".into()));
        let waiting = crate::ingest::waiting::Waiting::new(30_000, Vec::new(), Default::default());
        let mut index = Index::default();
        index.apply_pod(&bare_pod("shop", "api", "10.0.0.2"), 0);
        index.apply_pod(&bare_pod("other", "web", "10.0.0.5"), 0);

        // The frontend's first connection arrives before its IP is in the index.
        let obs = inbound(&index, "shop", "api", "10.0.0.3");
        assert_eq!(
            waiting.observation(&index, "node-a", &obs, 1_000),
            crate::ingest::waiting::Admitted::Waits(31_000)
        );
        assert_eq!(waiting.len(), 1);
        assert!(
            pending_names(&learner).is_empty(),
            "no /32 rule for a pod IP"
        );
        index.apply_pod(&bare_pod("shop", "frontend", "10.0.0.3"), 2_000);
        let decided = waiting.take_decided(&index, 3_000, crate::ingest::waiting::Look::Flush);
        assert_eq!(waiting.len(), 0);
        let learned: usize = decided
            .observations
            .into_iter()
            .map(|(obs, flows)| {
                learner
                    .learn(&index, &obs, flows, &mut WaitsFor::default())
                    .unwrap()
            })
            .sum();
        assert!(learned > 0);
        assert_eq!(
            pending_names(&learner),
            BTreeSet::from([
                "shop/pod-api-ingress".to_string(),
                "shop/pod-frontend-egress".to_string()
            ])
        );
        let mut pending = learner.pending.lock().unwrap();
        let key = pending
            .keys()
            .find(|t| t.workload.name == "api")
            .cloned()
            .unwrap();
        let api = pending.remove(&key).unwrap().into_ordered();
        assert!(
            api.iter().all(|e| !matches!(
                e,
                Edge::Kubernetes {
                    peer: FlowEnd::External(_),
                    ..
                }
            )),
            "{api:?}"
        );
        drop(pending);

        // A workload in another namespace than the one this controller watches teaches nothing.
        let elsewhere = inbound(&index, "other", "web", "10.0.0.2");
        learn_now(&learner, &index, &elsewhere, &mut WaitsFor::default()).unwrap();
        assert!(!pending_names(&learner).contains("other/pod-web-ingress"));
    }

    #[test]
    fn an_agent_teaches_a_peer_s_proposal_only_when_the_peer_has_a_pod_on_its_node() {
        let on = |name: &str, ip: &str, node: &str| {
            let mut pod = bare_pod("shop", name, ip);
            pod.spec.as_mut().unwrap().node_name = Some(node.into());
            pod
        };
        let mut index = Index::default();
        index.apply_pod(&on("client", "10.0.0.1", "node-a"), 0);
        index.apply_pod(&on("remote", "10.0.0.2", "node-b"), 0);
        index.apply_pod(&on("local", "10.0.0.3", "node-a"), 0);
        let to = |peer: &str, reporter| ReportedConnection {
            local: index.pod("shop", "client").expect("indexed").clone(),
            peer: peer.parse().unwrap(),
            port: 8080,
            protocol: Protocol::TCP,
            opened: learn::Opened::Outbound,
            at_ms: 0,
            reporter,
            peer_name: Default::default(),
        };
        let learned = |trust: bool, obs: &ReportedConnection| {
            let learner = learner().with_trust_remote_peers(trust);
            learner.observe(&index, obs).unwrap();
            pending_names(&learner)
        };
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        use learn::Reporter::{Cluster, Node};
        // (trust flag, observation, proposals taught)
        let cases = [
            (
                false,
                to("10.0.0.2", Node),
                names(&["shop/pod-client-egress"]),
            ),
            (
                false,
                to("10.0.0.3", Node),
                names(&["shop/pod-client-egress", "shop/pod-local-ingress"]),
            ),
            (
                false,
                to("10.0.0.2", Cluster),
                names(&["shop/pod-client-egress", "shop/pod-remote-ingress"]),
            ),
            (
                true,
                to("10.0.0.2", Node),
                names(&["shop/pod-client-egress", "shop/pod-remote-ingress"]),
            ),
        ];
        for (trust, obs, expected) in cases {
            assert_eq!(learned(trust, &obs), expected, "{trust} {obs:?}");
        }
        // Seen from the remote pod's side (its own node's report), the ingress is learned.
        let inbound = ReportedConnection {
            local: index.pod("shop", "remote").expect("indexed").clone(),
            peer: "10.0.0.1".parse().unwrap(),
            opened: learn::Opened::Inbound,
            ..to("10.0.0.1", Node)
        };
        assert_eq!(
            learned(false, &inbound),
            names(&["shop/pod-remote-ingress"])
        );
    }

    #[test]
    fn pending_edges_dedupe_keep_arrival_order_and_cap_external_addresses() {
        let external = |i: u8, port: u16| Edge::Kubernetes {
            peer: FlowEnd::External([203, 0, 113, i].into()),
            protocol: Protocol::TCP,
            port,
        };
        let node = Edge::Kubernetes {
            peer: FlowEnd::Node {
                ip: [10, 0, 0, 1].into(),
                name: "n".into(),
            },
            protocol: Protocol::TCP,
            port: 443,
        };
        let mut pending = PendingEdges::default();
        assert_eq!(pending.add(external(9, 443), 2), Added::New);
        assert_eq!(pending.add(external(9, 443), 2), Added::Known);
        assert_eq!(
            pending.add(node.clone(), 2),
            Added::New,
            "nodes are not capped"
        );
        assert_eq!(pending.add(external(1, 443), 2), Added::New);
        assert_eq!(pending.add(external(2, 443), 2), Added::Capped);
        assert_eq!(pending.add(external(2, 80), 2), Added::New, "per port");
        assert_eq!(pending.len(), 4);
        assert_eq!(
            pending.into_ordered(),
            [external(9, 443), node, external(1, 443), external(2, 80)]
        );
    }

    #[test]
    fn a_proposal_keeps_a_bounded_number_of_edges_pending() {
        let edge = |i: usize| Edge::Kubernetes {
            peer: FlowEnd::External(std::net::Ipv4Addr::from(0x0a00_0000 + i as u32).into()),
            protocol: Protocol::UDP,
            port: 1 + (i % 60_000) as u16,
        };
        let mut pending = PendingEdges::default();
        for i in 0..MAX_PENDING_EDGES {
            assert_eq!(pending.add(edge(i), usize::MAX), Added::New);
        }
        assert_eq!(pending.add(edge(0), usize::MAX), Added::Known);
        assert_eq!(
            pending.add(edge(MAX_PENDING_EDGES), usize::MAX),
            Added::Overflow
        );
        assert_eq!(pending.len(), MAX_PENDING_EDGES);
        assert_eq!(pending.overflow(), 1, "counted for the write's Event");
    }

    #[test]
    fn excluded_workloads_parse_and_refuse_bad_input() {
        let w: ExcludedWorkload = "shop/Deployment/web".parse().unwrap();
        assert_eq!(
            w,
            ExcludedWorkload {
                namespace: "shop".into(),
                kind: "deployment".into(),
                name: "web".into()
            }
        );
        assert!("shop/web".parse::<ExcludedWorkload>().is_err());
        assert!("shop/replicaset/web".parse::<ExcludedWorkload>().is_err());
        assert_eq!(
            "shop/CronJob/backup"
                .parse::<ExcludedWorkload>()
                .unwrap()
                .kind,
            "cronjob"
        );
        assert!("/deployment/web".parse::<ExcludedWorkload>().is_err());
    }
}
