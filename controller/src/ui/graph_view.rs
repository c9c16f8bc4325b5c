//! The graph page's data: a namespace's workloads and peers, and the flows between them, each with a
//! state (`learned`, `allowed`, `violation`, `blocked`). Pure: a [`Snapshot`] in, a [`GraphView`] out.
//!
//! Nodes and rule edges come from [`crate::graph::model`], the same model the `graph` command
//! draws, so the page and the DOT never disagree. Violation edges are added here from the policies'
//! active records, with their ids and times (the time window filters on them).

use crate::graph::{self, GraphInput, GraphModel};
use crate::ui::objects::Snapshot;
use network_enforcer_api::PolicyMode;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// At most this many nodes and edges per answer; past it the view says `truncated`.
pub const MAX_NODES: usize = 2_000;
pub const MAX_EDGES: usize = 10_000;

/// The id of the node external peers are grouped into.
pub const EXTERNAL_GROUP: &str = "x:*";

/// What the graph page asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GraphQuery {
    pub namespace: String,
    /// Only edges touching this workload (`name` or `Kind/name`).
    pub workload: Option<String>,
    /// Only violations seen in the last this many seconds (rules are always shown: they are state,
    /// not events).
    pub window_seconds: Option<i64>,
    /// One node per external address instead of one group.
    pub ungroup_external: bool,
}

/// An edge's state, for colour and legend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum EdgeState {
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
    /// Newest violation time of the edge, ms since the epoch (violation edges only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_seen_ms: Option<i64>,
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

/// Builds the graph of `query.namespace` from `snapshot`.
pub fn build(snapshot: &Snapshot, query: &GraphQuery) -> GraphView {
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
        EdgeState::Learned => "learned",
        EdgeState::Allowed => "allowed",
        EdgeState::Violation => "violation",
        EdgeState::Blocked => "blocked",
    }
}

fn from_model(namespace: &str, model: GraphModel, input: &GraphInput) -> GraphView {
    let nodes = model
        .nodes
        .into_iter()
        .map(|n| GraphNode {
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
        })
        .collect();
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
            let (from, to) = (
                graph::violation_node_id(&v.source),
                graph::violation_node_id(&v.dest),
            );
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
                    EdgeState::Violation | EdgeState::Blocked => {
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
            }
        }
    }
    view.edges = merged.into_values().collect();
}
