//! The cluster overview (`#/`): the operator's first question, "which workloads are not protected
//! yet, and where are the violations", across namespaces. One row per workload that has a proposal
//! or a policy, with the state of each direction, its active violations, and whether a policy warns
//! that protect would block observed flows (`WouldBlock`) or holds rules nothing used
//! (`UnusedRules`); and one row per namespace summing them. Pure: a [`Snapshot`] in, an
//! [`Overview`] out.

use crate::policy::conditions::{UNUSED_RULES, WOULD_BLOCK};
use crate::ui::objects::Snapshot;
use network_enforcer_api::{Direction, PolicyMode, WorkloadNetworkPolicyStatus};
use serde::Serialize;
use std::collections::BTreeMap;

/// At most this many workload rows are answered (namespaces are always complete).
pub const MAX_WORKLOADS: usize = 5_000;

/// What governs one direction of a workload, from least to most enforced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Neither a proposal nor a policy for this direction.
    #[default]
    None,
    /// A proposal only: learning.
    Learning,
    /// A policy in monitor.
    Monitor,
    /// A policy in protect.
    Protect,
}

/// One workload.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadRow {
    pub namespace: String,
    pub kind: String,
    pub name: String,
    pub egress: State,
    pub ingress: State,
    /// The less enforced of the two directions: what the workload is as a whole.
    pub state: State,
    pub active_violations: i64,
    /// A policy's `WouldBlock` is True: protect would block observed flows.
    pub would_block: bool,
    /// A policy's `UnusedRules` is True.
    pub unused_rules: bool,
}

/// One namespace, summed over its workloads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceRow {
    pub namespace: String,
    pub workloads: usize,
    /// Workloads by [`WorkloadRow::state`].
    pub learning: usize,
    pub monitor: usize,
    pub protect: usize,
    pub active_violations: i64,
    /// Workloads with a `WouldBlock` warning.
    pub would_block: usize,
    /// Workloads with unused rules.
    pub unused_rules: usize,
}

/// The overview's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Overview {
    pub namespaces: Vec<NamespaceRow>,
    /// Workloads, those needing attention first: active violations, then warnings, then the least
    /// enforced.
    pub workloads: Vec<WorkloadRow>,
    /// More than [`MAX_WORKLOADS`] workloads: the rest are left out (the namespace rows count them).
    pub truncated: bool,
}

fn condition_true(status: Option<&WorkloadNetworkPolicyStatus>, type_: &str) -> bool {
    status.is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == "True")
    })
}

type Key = (String, String, String);

fn row<'a>(
    rows: &'a mut BTreeMap<Key, WorkloadRow>,
    namespace: &str,
    kind: &str,
    name: &str,
) -> &'a mut WorkloadRow {
    rows.entry((namespace.into(), kind.into(), name.into()))
        .or_insert_with(|| WorkloadRow {
            namespace: namespace.into(),
            kind: kind.into(),
            name: name.into(),
            ..WorkloadRow::default()
        })
}

fn direction(row: &mut WorkloadRow, direction: Direction) -> &mut State {
    match direction {
        Direction::Egress => &mut row.egress,
        Direction::Ingress => &mut row.ingress,
    }
}

/// The overview of `snapshot`.
pub fn build(snapshot: &Snapshot) -> Overview {
    let mut rows: BTreeMap<Key, WorkloadRow> = BTreeMap::new();
    for p in &snapshot.proposals {
        let target = &p.spec.target_ref;
        let namespace = p.metadata.namespace.as_deref().unwrap_or_default();
        let r = row(&mut rows, namespace, target.kind.as_str(), &target.name);
        let state = direction(r, p.spec.direction);
        *state = (*state).max(State::Learning);
    }
    for p in &snapshot.policies {
        let spec = &p.policy.spec;
        let status = p.policy.status.as_ref();
        let r = row(
            &mut rows,
            p.namespace(),
            spec.target_ref.kind.as_str(),
            &spec.target_ref.name,
        );
        let mode = match spec.mode {
            PolicyMode::Monitor => State::Monitor,
            PolicyMode::Protect => State::Protect,
        };
        let state = direction(r, spec.direction);
        *state = (*state).max(mode);
        r.active_violations += status.map_or(0, |s| s.active_violation_count);
        r.would_block |= condition_true(status, WOULD_BLOCK);
        r.unused_rules |= condition_true(status, UNUSED_RULES);
    }
    let mut namespaces: BTreeMap<String, NamespaceRow> = BTreeMap::new();
    let mut workloads: Vec<WorkloadRow> = rows.into_values().collect();
    for w in &mut workloads {
        // A direction nothing learned nor governs does not make the workload unprotected: a workload
        // that only calls out has no ingress proposal.
        w.state = match (w.egress, w.ingress) {
            (State::None, other) | (other, State::None) => other,
            (a, b) => a.min(b),
        };
        let n = namespaces
            .entry(w.namespace.clone())
            .or_insert_with(|| NamespaceRow {
                namespace: w.namespace.clone(),
                ..NamespaceRow::default()
            });
        n.workloads += 1;
        match w.state {
            State::Learning | State::None => n.learning += 1,
            State::Monitor => n.monitor += 1,
            State::Protect => n.protect += 1,
        }
        n.active_violations += w.active_violations;
        n.would_block += usize::from(w.would_block);
        n.unused_rules += usize::from(w.unused_rules);
    }
    workloads.sort_by(|a, b| {
        b.active_violations
            .cmp(&a.active_violations)
            .then(b.would_block.cmp(&a.would_block))
            .then(a.state.cmp(&b.state))
            .then_with(|| (&a.namespace, &a.kind, &a.name).cmp(&(&b.namespace, &b.kind, &b.name)))
    });
    let truncated = workloads.len() > MAX_WORKLOADS;
    workloads.truncate(MAX_WORKLOADS);
    Overview {
        namespaces: namespaces.into_values().collect(),
        workloads,
        truncated,
    }
}
