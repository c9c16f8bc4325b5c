//! The graph page's data: a namespace's workloads and peers, and the flows between them, each with a
//! state (`learned`, `allowed`, `violation`, `blocked`). Pure: a [`Snapshot`] in, a [`GraphView`] out.
//!
//! Nodes and rule edges come from [`crate::graph::model`], the same model the `graph` command
//! draws, so the page and the DOT never disagree. Violation edges are added here from the policies'
//! active records, with their ids and times (the time window filters on them). The flows the
//! controller observed ([`HistoryEdge`], from the protect gate's history) say which tier decides each
//! edge now; a pair of nodes no rule or record joins gets an `observed` edge.

use crate::graph::{self, GraphInput, GraphModel};
use crate::monitor::edge_history::HistoryEdge;
use crate::monitor::evaluate::verdict::{SideDecision, TierName};
use crate::ui::objects::Snapshot;
use ipnet::IpNet;
use network_enforcer_api::{PolicyMode, WorkloadRef};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// At most this many nodes and edges per answer; past it the view says `truncated`.
pub const MAX_NODES: usize = 2_000;
pub const MAX_EDGES: usize = 10_000;

/// At most this many decisions per edge (one per port and outcome is the usual count).
pub const MAX_DECISIONS: usize = 16;

/// The id of the node external peers are grouped into.
pub const EXTERNAL_GROUP: &str = "x:*";

/// What the graph page asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GraphQuery {
    pub namespace: String,
    /// Only edges touching this workload (`name` or `Kind/name`).
    pub workload: Option<String>,
    /// Only violations and observed flows seen in the last this many seconds (rules are always
    /// shown: they are state, not events).
    pub window_seconds: Option<i64>,
    /// One node per external address instead of one group.
    pub ungroup_external: bool,
}

/// An edge's state, for colour and legend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum EdgeState {
    /// Seen going through, and no rule or record of a proposal or policy joins the pair.
    Observed,
    /// Only a proposal has it: learned, nothing promoted allows it yet.
    Learned,
    /// A promoted policy's rule allows it.
    Allowed,
    /// A monitor-mode policy recorded it as not allowed (it went through).
    Violation,
    /// A protect-mode policy recorded it as blocked.
    Blocked,
}

/// One node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GraphNode {
    pub id: String,
    /// `workload`, `selector`, `external`, `identity` or `name` (a DNS name of an outside service,
    /// from `spec.egressNames` or a violation's `dest.dnsName`).
    pub kind: &'static str,
    pub namespace: String,
    pub workload_kind: String,
    pub name: String,
    /// `learning`, `monitor` or `protect` per direction.
    pub governance: Vec<Governance>,
    /// The addresses grouped into this node: the external group's, or the addresses a `name` node's
    /// violations went to (what the pods resolved the name to), shown on hover.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Governance {
    pub direction: &'static str,
    /// The policy or proposal.
    pub name: String,
    pub mode: &'static str,
}

/// One violation record behind a violation edge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EdgeViolation {
    pub policy: String,
    pub id: i64,
    pub timestamp: String,
}

/// One edge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GraphEdge {
    pub id: String,
    pub from: String,
    pub to: String,
    pub state: EdgeState,
    /// `TCP 18080`, `UDP any`, `any port`.
    pub ports: Vec<String>,
    /// `policy (mode)` of the policies that allow it.
    pub allowed_by: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub violations: Vec<EdgeViolation>,
    /// Newest violation time of the edge, ms since the epoch (violation and observed edges).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_seen_ms: Option<i64>,
    /// The tiers that decide the flows observed on this edge now, in precedence order (`admin`,
    /// `networkPolicy`, `baseline`, `default`): per flow the tier of the side that denies it (the
    /// egress first), else the first tier that decided a side.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tiers: Vec<TierName>,
    /// Per observed port: which tier decides each side, at most [`MAX_DECISIONS`].
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<EdgeDecision>,
}

/// Which tiers decide an observed flow of an edge, per side, with the policies in force now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EdgeDecision {
    /// `TCP 443`.
    pub port: String,
    pub egress: SideDecision,
    pub ingress: SideDecision,
}

impl EdgeDecision {
    /// The tier that decided the flow: the denying side's (the egress first), else the first
    /// cluster or NetworkPolicy tier that decided a side, else the default.
    fn tier(&self) -> TierName {
        let sides = [&self.egress, &self.ingress];
        match sides.iter().find(|side| !side.allowed) {
            Some(denying) => TierName(denying.tier),
            None => sides
                .iter()
                .map(|side| TierName(side.tier))
                .min()
                .unwrap_or(TierName(netpol::cluster::Decider::Default)),
        }
    }
}

/// The graph page's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GraphView {
    pub namespace: String,
    pub nodes: Vec<GraphNode>,
    pub edges: Vec<GraphEdge>,
    /// Edges per state (before truncation).
    pub counts: BTreeMap<String, usize>,
    /// True when nodes or edges were cut at [`MAX_NODES`] / [`MAX_EDGES`].
    pub truncated: bool,
}

/// Builds the graph of `query.namespace` from `snapshot` and the flows `observed` with an end in
/// that namespace (none where this process keeps no history).
pub fn build(snapshot: &Snapshot, query: &GraphQuery, observed: &[HistoryEdge]) -> GraphView {
    let since_ms = query
        .window_seconds
        .map(|s| snapshot.now_ms.saturating_sub(s.saturating_mul(1000)));
    let in_window = |ms: i64| since_ms.is_none_or(|since| ms >= since);
    // Policies with only the violations in the window, so the model draws exactly their ends.
    let policies = snapshot
        .policies
        .iter()
        .map(|p| {
            let mut policy = p.policy.clone();
            if let Some(status) = policy.status.as_mut() {
                status
                    .violations
                    .retain(|v| in_window(v.timestamp.0.as_millisecond()));
            }
            policy
        })
        .collect::<Vec<_>>();
    let input = GraphInput {
        proposals: snapshot.proposals.clone(),
        policies,
    };
    let model = graph::model(&input, Some(&query.namespace));
    let mut view = from_model(&query.namespace, model, &input);
    add_observed(
        &mut view,
        observed.iter().filter(|e| in_window(e.last_seen_ms)),
    );
    if let Some(workload) = &query.workload {
        keep_workload(&mut view, workload);
    }
    if !query.ungroup_external {
        group_external(&mut view);
    }
    for edge in &view.edges {
        *view
            .counts
            .entry(state_name(edge.state).into())
            .or_default() += 1;
    }
    if view.nodes.len() > MAX_NODES || view.edges.len() > MAX_EDGES {
        view.truncated = true;
        // Violations first: they are what a reader looks for.
        view.edges
            .sort_by(|a, b| b.state.cmp(&a.state).then(a.id.cmp(&b.id)));
        view.edges.truncate(MAX_EDGES);
        view.nodes.truncate(MAX_NODES);
        let ids: BTreeSet<&str> = view.nodes.iter().map(|n| n.id.as_str()).collect();
        let edges = std::mem::take(&mut view.edges);
        view.edges = edges
            .into_iter()
            .filter(|e| ids.contains(e.from.as_str()) && ids.contains(e.to.as_str()))
            .collect();
    }
    view
}

fn state_name(state: EdgeState) -> &'static str {
    match state {
        EdgeState::Observed => "observed",
        EdgeState::Learned => "learned",
        EdgeState::Allowed => "allowed",
        EdgeState::Violation => "violation",
        EdgeState::Blocked => "blocked",
    }
}

fn graph_node(n: graph::ModelNode) -> GraphNode {
    GraphNode {
        id: n.id,
        kind: n.kind,
        namespace: n.namespace,
        workload_kind: n.workload_kind,
        name: n.name,
        governance: n
            .governance
            .into_iter()
            .map(|(direction, name, mode)| Governance {
                direction: direction.as_str(),
                name,
                mode,
            })
            .collect(),
        // A name stays one node (not grouped with the addresses): its addresses rotate.
        members: n.addresses,
    }
}

fn from_model(namespace: &str, model: GraphModel, input: &GraphInput) -> GraphView {
    let nodes = model.nodes.into_iter().map(graph_node).collect();
    let mut edges: Vec<GraphEdge> = model
        .edges
        .into_iter()
        .map(|e| GraphEdge {
            id: format!("{}>{}", e.from, e.to),
            state: if e.allowed_by.is_empty() {
                EdgeState::Learned
            } else {
                EdgeState::Allowed
            },
            allowed_by: e
                .allowed_by
                .iter()
                .map(|(policy, mode)| format!("{policy} ({mode})"))
                .collect(),
            from: e.from,
            to: e.to,
            ports: e.labels,
            violations: Vec::new(),
            last_seen_ms: None,
            tiers: Vec::new(),
            decisions: Vec::new(),
        })
        .collect();
    // One edge per pair and state: a monitor violation and a protect block of the same pair differ.
    let mut violations: BTreeMap<(String, String, EdgeState), GraphEdge> = BTreeMap::new();
    for policy in &input.policies {
        if policy.metadata.namespace.as_deref() != Some(namespace) {
            continue;
        }
        let name = policy.metadata.name.clone().unwrap_or_default();
        for v in policy.status.iter().flat_map(|s| &s.violations) {
            let (from, to) = (graph::node_id(&v.source), graph::node_id(&v.dest));
            let state = match v.action {
                PolicyMode::Monitor => EdgeState::Violation,
                PolicyMode::Protect => EdgeState::Blocked,
            };
            let ms = v.timestamp.0.as_millisecond();
            let edge = violations
                .entry((from.clone(), to.clone(), state))
                .or_insert_with(|| GraphEdge {
                    id: format!("{from}>{to}!{}", state_name(state)),
                    from,
                    to,
                    state,
                    ports: Vec::new(),
                    allowed_by: Vec::new(),
                    violations: Vec::new(),
                    last_seen_ms: Some(ms),
                    tiers: Vec::new(),
                    decisions: Vec::new(),
                });
            let port = match v.dst_port {
                Some(p) => format!("{} {p}", v.protocol.as_str()),
                None => format!("{} any", v.protocol.as_str()),
            };
            if !edge.ports.contains(&port) {
                edge.ports.push(port);
            }
            edge.last_seen_ms = edge.last_seen_ms.max(Some(ms));
            edge.violations.push(EdgeViolation {
                policy: name.clone(),
                id: v.id,
                timestamp: v.timestamp.0.to_string(),
            });
        }
    }
    for mut edge in violations.into_values() {
        edge.ports.sort();
        edges.push(edge);
    }
    GraphView {
        namespace: namespace.to_string(),
        nodes,
        edges,
        ..GraphView::default()
    }
}

/// Adds what the `observed` flows say to the edges that stand for them: a rule edge that covers the
/// flow (its pair of nodes, or one end and a selector, address block or name that may stand for the
/// other, on a port it lists), else a violation edge of the pair on its port, else an `observed` edge
/// of the pair (a flow no proposal or policy names: one an Admin ClusterNetworkPolicy accepts, or of a
/// workload nothing learns yet), with nodes for ends nothing else draws.
fn add_observed<'a>(view: &mut GraphView, observed: impl Iterator<Item = &'a HistoryEdge>) {
    let index = EdgeIndex::of(&view.edges);
    let mut drawn: BTreeSet<String> = view.nodes.iter().map(|n| n.id.clone()).collect();
    let mut own: BTreeMap<(String, String), usize> = BTreeMap::new();
    for flow in observed {
        let ends = (
            graph::node_id(&flow.source),
            graph::node_id(&flow.destination),
        );
        let port = format!("{} {}", flow.protocol.as_str(), flow.port);
        let at = match index.covering(&view.edges, flow, &ends, &port) {
            Some(at) => at,
            None => {
                for w in [&flow.source, &flow.destination] {
                    let node = graph::flow_node(w);
                    if drawn.insert(node.id.clone()) {
                        view.nodes.push(graph_node(node));
                    }
                }
                *own.entry(ends).or_insert_with_key(|(from, to)| {
                    view.edges.push(GraphEdge {
                        id: format!("{from}>{to}!observed"),
                        from: from.clone(),
                        to: to.clone(),
                        state: EdgeState::Observed,
                        ports: Vec::new(),
                        allowed_by: Vec::new(),
                        violations: Vec::new(),
                        last_seen_ms: None,
                        tiers: Vec::new(),
                        decisions: Vec::new(),
                    });
                    view.edges.len() - 1
                })
            }
        };
        let edge = &mut view.edges[at];
        if edge.state == EdgeState::Observed {
            // Sorted and made unique once all are in (a port scan is thousands).
            edge.ports.push(port.clone());
            edge.last_seen_ms = edge.last_seen_ms.max(Some(flow.last_seen_ms));
        }
        if let (Some(egress), Some(ingress)) = (&flow.egress, &flow.ingress) {
            merge_decisions(
                edge,
                [EdgeDecision {
                    port,
                    egress: egress.clone(),
                    ingress: ingress.clone(),
                }],
            );
        }
    }
    for &at in own.values() {
        let ports = &mut view.edges[at].ports;
        ports.sort();
        ports.dedup();
    }
}

/// The rule and violation edges by their nodes, so that placing each of thousands of observed
/// flows looks at the edges of its own nodes only.
#[derive(Default)]
struct EdgeIndex {
    by_pair: BTreeMap<(String, String), Vec<usize>>,
    by_from: BTreeMap<String, Vec<usize>>,
    by_to: BTreeMap<String, Vec<usize>>,
}

impl EdgeIndex {
    fn of(edges: &[GraphEdge]) -> Self {
        let mut index = EdgeIndex::default();
        for (at, e) in edges.iter().enumerate() {
            let pair = (e.from.clone(), e.to.clone());
            index.by_pair.entry(pair).or_default().push(at);
            index.by_from.entry(e.from.clone()).or_default().push(at);
            index.by_to.entry(e.to.clone()).or_default().push(at);
        }
        index
    }

    /// The index of the edge `flow` (drawn between the nodes `ends`) is shown on, if one stands
    /// for it.
    fn covering(
        &self,
        edges: &[GraphEdge],
        flow: &HistoryEdge,
        (from, to): &(String, String),
        port: &str,
    ) -> Option<usize> {
        let rule = |at: &&usize| {
            let e = &edges[**at];
            matches!(e.state, EdgeState::Learned | EdgeState::Allowed)
                && e.ports.iter().any(|label| covers(label, flow))
        };
        let recorded = |at: &&usize| {
            let e = &edges[**at];
            matches!(e.state, EdgeState::Violation | EdgeState::Blocked)
                && e.ports.iter().any(|p| p == port)
        };
        fn of<'m>(map: &'m BTreeMap<String, Vec<usize>>, key: &str) -> &'m [usize] {
            map.get(key).map(Vec::as_slice).unwrap_or_default()
        }
        let pair: &[usize] = self
            .by_pair
            .get(&(from.clone(), to.clone()))
            .map(Vec::as_slice)
            .unwrap_or_default();
        pair.iter()
            .find(rule)
            .or_else(|| pair.iter().find(recorded))
            .or_else(|| {
                of(&self.by_from, from)
                    .iter()
                    .find(|at| rule(at) && may_stand_for(&edges[**at].to, &flow.destination))
            })
            .or_else(|| {
                of(&self.by_to, to)
                    .iter()
                    .find(|at| rule(at) && may_stand_for(&edges[**at].from, &flow.source))
            })
            .copied()
    }
}

/// Whether a rule's port label (`TCP 18080`, `TCP 8000-8080`, `UDP any`, `any port`) covers the
/// flow's protocol and port. A named port covers nothing here (the pod's ports are not known).
pub(super) fn covers(label: &str, flow: &HistoryEdge) -> bool {
    if label == "any port" {
        return true;
    }
    let Some((protocol, ports)) = label.split_once(' ') else {
        return false;
    };
    if protocol != flow.protocol.as_str() {
        return false;
    }
    let number = |p: &str| p.parse::<u16>().ok();
    match ports.split_once('-') {
        _ if ports == "any" => true,
        Some((first, last)) => number(first)
            .zip(number(last))
            .is_some_and(|(a, b)| (a..=b).contains(&flow.port)),
        None => number(ports) == Some(flow.port),
    }
}

/// Whether the graph node `id` (a rule's peer) may stand for the flow's end `w`: a selector of
/// the end's namespace (or of every namespace) whose labels the end's pod has (`w.selector`: the
/// labels of the pod it was seen at, cut at a bound), an address block holding its address (and
/// none of its exceptions), `any`, or a wildcard name the name it was resolved from falls under.
/// Namespace labels are not here: a selector of namespaces by label is not taken to hold it (the
/// flow gets its own edge).
pub(super) fn may_stand_for(id: &str, w: &WorkloadRef) -> bool {
    if let Some(selector) = id.strip_prefix("s:") {
        let workload = !w.owner_name.is_empty() && w.address.is_empty();
        let pods = match selector.split_once('/') {
            // `namespaces <selector> / <pods>`: only a selector of every namespace is known to
            // hold the end's.
            Some(("", any)) => any.strip_prefix("namespaces all / "),
            Some((namespace, pods)) if namespace == w.namespace => Some(pods),
            _ => None,
        };
        return workload && pods.is_some_and(|pods| selects(pods, &w.selector));
    }
    if let Some(block) = id.strip_prefix("x:") {
        if block == "any" {
            return true;
        }
        let Ok(ip) = w.address.parse::<IpAddr>() else {
            return false;
        };
        let (cidr, except) = block.split_once(" except ").unwrap_or((block, ""));
        let holds = |net: &str| {
            net.parse::<IpNet>().is_ok_and(|net| net.contains(&ip)) || net.parse() == Ok(ip)
        };
        return holds(cidr) && !except.split(", ").any(holds);
    }
    if let Some(pattern) = id.strip_prefix("n:").filter(|p| p.starts_with("*.")) {
        return network_enforcer_api::dns_name::matches(pattern, &w.dns_name);
    }
    false
}

/// Whether a selector's text (`{app=db, tier=data}`, `all`; expressions are not read) picks a pod
/// whose labels are `labels` (`app=db,tier=data`).
fn selects(pods: &str, labels: &str) -> bool {
    if pods == "all" {
        return true;
    }
    let Some(wanted) = pods.strip_prefix('{').and_then(|p| p.strip_suffix('}')) else {
        return false;
    };
    let own: BTreeSet<&str> = labels.split(',').collect();
    wanted.split(", ").all(|label| own.contains(label))
}

/// Adds `decisions` to `edge`'s (once each, within [`MAX_DECISIONS`]) and their tiers (all of them,
/// past the bound too).
fn merge_decisions(edge: &mut GraphEdge, decisions: impl IntoIterator<Item = EdgeDecision>) {
    for decision in decisions {
        let tier = decision.tier();
        if !edge.tiers.contains(&tier) {
            edge.tiers.push(tier);
            edge.tiers.sort();
        }
        if edge.decisions.len() < MAX_DECISIONS && !edge.decisions.contains(&decision) {
            edge.decisions.push(decision);
        }
    }
}

/// Keeps the edges touching `workload` (`name` or `Kind/name`) and the nodes they join.
fn keep_workload(view: &mut GraphView, workload: &str) {
    let (kind, name) = match workload.split_once('/') {
        Some((k, n)) => (Some(k), n),
        None => (None, workload),
    };
    let selected: BTreeSet<String> = view
        .nodes
        .iter()
        .filter(|n| {
            n.kind == "workload"
                && n.name == name
                && kind.is_none_or(|k| n.workload_kind.eq_ignore_ascii_case(k))
        })
        .map(|n| n.id.clone())
        .collect();
    view.edges
        .retain(|e| selected.contains(&e.from) || selected.contains(&e.to));
    let joined: BTreeSet<&String> = view
        .edges
        .iter()
        .flat_map(|e| [&e.from, &e.to])
        .chain(&selected)
        .collect();
    let nodes = std::mem::take(&mut view.nodes);
    view.nodes = nodes
        .into_iter()
        .filter(|n| joined.contains(&n.id))
        .collect();
}

/// Replaces every external-address node with one group node; edges that become the same pair and
/// state merge their ports.
fn group_external(view: &mut GraphView) {
    let external: BTreeSet<String> = view
        .nodes
        .iter()
        .filter(|n| n.kind == "external")
        .map(|n| n.id.clone())
        .collect();
    if external.is_empty() {
        return;
    }
    let members: Vec<String> = view
        .nodes
        .iter()
        .filter(|n| external.contains(&n.id))
        .map(|n| n.name.clone())
        .collect();
    view.nodes.retain(|n| !external.contains(&n.id));
    view.nodes.push(GraphNode {
        id: EXTERNAL_GROUP.into(),
        kind: "external",
        namespace: String::new(),
        workload_kind: String::new(),
        name: format!("external ({})", members.len()),
        governance: Vec::new(),
        members,
    });
    let regroup = |id: &mut String| {
        if external.contains(id) {
            *id = EXTERNAL_GROUP.into();
        }
    };
    let mut merged: BTreeMap<(String, String, EdgeState), GraphEdge> = BTreeMap::new();
    for mut edge in std::mem::take(&mut view.edges) {
        regroup(&mut edge.from);
        regroup(&mut edge.to);
        match merged.entry((edge.from.clone(), edge.to.clone(), edge.state)) {
            std::collections::btree_map::Entry::Vacant(slot) => {
                let suffix = match edge.state {
                    EdgeState::Violation | EdgeState::Blocked | EdgeState::Observed => {
                        format!("!{}", state_name(edge.state))
                    }
                    _ => String::new(),
                };
                edge.id = format!("{}>{}{suffix}", edge.from, edge.to);
                slot.insert(edge);
            }
            std::collections::btree_map::Entry::Occupied(mut slot) => {
                let into = slot.get_mut();
                for port in edge.ports {
                    if !into.ports.contains(&port) {
                        into.ports.push(port);
                    }
                }
                for by in edge.allowed_by {
                    if !into.allowed_by.contains(&by) {
                        into.allowed_by.push(by);
                    }
                }
                into.violations.extend(edge.violations);
                into.last_seen_ms = into.last_seen_ms.max(edge.last_seen_ms);
                into.ports.sort();
                // The tiers of decisions past the bound are in the edge's tiers only.
                for tier in edge.tiers {
                    if !into.tiers.contains(&tier) {
                        into.tiers.push(tier);
                        into.tiers.sort();
                    }
                }
                merge_decisions(into, edge.decisions);
            }
        }
    }
    view.edges = merged.into_values().collect();
}
