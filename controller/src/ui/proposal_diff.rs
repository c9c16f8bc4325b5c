//! The proposal diff page's data: what promoting a proposal would allow, compared with what is
//! allowed now and with what was observed (the proposal's learned rules, and the violations its
//! workload's policy recorded). Pure: a [`Snapshot`] in, a [`ProposalDiff`] out.
//!
//! Both sides come from [`crate::graph::model`] over the whole namespace, so a rule's peer
//! names the workload it selects the same way in both: "now" is the namespace as it is; "after" has
//! the proposal in force as a policy (in place of the policy it was promoted into, if any).

use crate::graph::{self, GraphInput, GraphModel};
use crate::policy::uniqueness;
use crate::policy::validity::Backends;
use crate::ui::objects::Snapshot;
use network_enforcer_api::{PolicyMode, WorkloadNetworkPolicy, WorkloadNetworkPolicySpec};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// The policy name the proposal stands in under in the "after" graph (not a valid object name, so
/// it cannot collide with a real policy).
const PROMOTED: &str = "<promoted proposal>";

/// One peer and port of the diff.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiffRow {
    /// The other end: a workload (`w:ns/Kind/name`), selector, address, identity or DNS name
    /// (`n:api.example.test`: a name of `egressNames`, or the name a violation's address was resolved
    /// from) node id.
    pub peer: String,
    /// `TCP 5432`, `any port`.
    pub port: String,
    /// Allowed by a policy in force now.
    pub allowed_now: bool,
    /// Allowed once the proposal is promoted.
    pub allowed_after: bool,
    /// The proposal learned it (traffic was seen).
    pub learned: bool,
    /// Active violation records of the workload's policy for it.
    pub violations: usize,
}

/// The diff page's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProposalDiff {
    pub namespace: String,
    pub proposal: String,
    pub workload: String,
    pub direction: &'static str,
    /// The policy in force for the same workload and direction, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Every peer and port, sorted: changes first.
    pub rows: Vec<DiffRow>,
    /// Rows that promoting would newly allow / stop allowing.
    pub added: usize,
    pub removed: usize,
    /// Observed violations that promoting would allow.
    pub violations_allowed_after: usize,
}

/// The diff of proposal `name` in `namespace`; `None` when there is no such proposal.
pub fn build(snapshot: &Snapshot, namespace: &str, name: &str) -> Option<ProposalDiff> {
    let proposal = snapshot.proposals.iter().find(|p| {
        p.metadata.namespace.as_deref() == Some(namespace)
            && p.metadata.name.as_deref() == Some(name)
    })?;
    let target = &proposal.spec.target_ref;
    let direction = proposal.spec.direction;
    let same_target = |p: &WorkloadNetworkPolicy| {
        p.metadata.namespace.as_deref() == Some(namespace)
            && p.spec.target_ref == *target
            && p.spec.direction == direction
    };
    let policies: Vec<WorkloadNetworkPolicy> =
        snapshot.policies.iter().map(|p| p.policy.clone()).collect();
    // The one in force, as the reconciler elects it. The web view keeps no memory of backends: the CRDs'
    // rules alone judge validity here.
    let nothing_remembered = Backends::default();
    let rivals: Vec<&WorkloadNetworkPolicy> = policies.iter().filter(|p| same_target(p)).collect();
    let current = rivals
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .find(|p| {
            uniqueness::winner_over(p, rivals.iter().copied(), |q| {
                nothing_remembered.is_valid(q)
            })
            .is_none()
        })
        .map(|p| (*p).clone());
    let now = graph::model(
        &GraphInput {
            proposals: snapshot.proposals.clone(),
            policies: policies.clone(),
        },
        Some(namespace),
    );
    let mut promoted = WorkloadNetworkPolicy::new(
        PROMOTED,
        WorkloadNetworkPolicySpec {
            backend: proposal.spec.backend,
            kubernetes: proposal.spec.kubernetes.clone(),
            istio: proposal.spec.istio.clone(),
            target_ref: target.clone(),
            direction,
            mode: PolicyMode::Monitor,
            egress_names: proposal.spec.egress_names.clone(),
        },
    );
    promoted.metadata.namespace = Some(namespace.to_string());
    let after = graph::model(
        &GraphInput {
            // Proposals too: their targets are what rules' selectors resolve to.
            proposals: snapshot.proposals.clone(),
            policies: policies
                .iter()
                .filter(|p| !same_target(p))
                .cloned()
                .chain([promoted])
                .collect(),
        },
        Some(namespace),
    );
    let target_id = format!("w:{namespace}/{}/{}", target.kind.as_str(), target.name);
    let current_name = current.as_ref().and_then(|p| p.metadata.name.clone());
    let peer_of = |from: &str, to: &str| -> Option<String> {
        match direction {
            network_enforcer_api::Direction::Egress if from == target_id => Some(to.to_string()),
            network_enforcer_api::Direction::Ingress if to == target_id => Some(from.to_string()),
            _ => None,
        }
    };
    // (peer, port) → row.
    let mut rows: BTreeMap<(String, String), DiffRow> = BTreeMap::new();
    let allowed_by = |model: &GraphModel, policy: &str| -> BTreeSet<(String, String)> {
        model
            .edges
            .iter()
            .filter(|e| e.allowed_by.iter().any(|(p, _)| p == policy))
            .filter_map(|e| Some((peer_of(&e.from, &e.to)?, e.labels.clone())))
            .flat_map(|(peer, labels)| labels.into_iter().map(move |l| (peer.clone(), l)))
            .collect()
    };
    if let Some(current) = &current_name {
        for (peer, port) in allowed_by(&now, current) {
            entry(&mut rows, peer, port).allowed_now = true;
        }
    }
    // Promoting puts exactly the learned rules in force: what it allows is what was learned.
    for (peer, port) in allowed_by(&after, PROMOTED) {
        let row = entry(&mut rows, peer, port);
        row.allowed_after = true;
        row.learned = true;
    }
    // Observed violations of the current policy: would the promoted rules allow them?
    let mut violations_allowed_after = 0;
    for v in current
        .iter()
        .flat_map(|p| p.status.iter().flat_map(|s| &s.violations))
    {
        let (from, to) = (graph::node_id(&v.source), graph::node_id(&v.dest));
        let Some(peer) = peer_of(&from, &to) else {
            continue;
        };
        let port = match v.dst_port {
            Some(p) => format!("{} {p}", v.protocol.as_str()),
            None => format!("{} any", v.protocol.as_str()),
        };
        let allowed = rows
            .values()
            .any(|r| r.peer == peer && r.allowed_after && port_covers(&r.port, &port));
        if allowed {
            violations_allowed_after += 1;
        }
        let r = entry(&mut rows, peer, port);
        r.violations += 1;
        r.allowed_after |= allowed;
    }
    let mut rows: Vec<DiffRow> = rows.into_values().collect();
    rows.sort_by_key(|r| {
        (
            r.allowed_now == r.allowed_after,
            r.peer.clone(),
            r.port.clone(),
        )
    });
    Some(ProposalDiff {
        namespace: namespace.to_string(),
        proposal: name.to_string(),
        workload: format!("{}/{}", target.kind.as_str(), target.name),
        direction: direction.as_str(),
        policy: current_name,
        added: rows
            .iter()
            .filter(|r| r.allowed_after && !r.allowed_now)
            .count(),
        removed: rows
            .iter()
            .filter(|r| r.allowed_now && !r.allowed_after)
            .count(),
        violations_allowed_after,
        rows,
    })
}

/// The row of `peer` and `port`, created empty.
fn entry(
    rows: &mut BTreeMap<(String, String), DiffRow>,
    peer: String,
    port: String,
) -> &mut DiffRow {
    rows.entry((peer.clone(), port.clone()))
        .or_insert_with(|| DiffRow {
            peer,
            port,
            allowed_now: false,
            allowed_after: false,
            learned: false,
            violations: 0,
        })
}

/// Whether a rule's port label (`TCP 80`, `TCP 80-90`, `TCP any`, `any port`, a named port) covers
/// an observed `PROTO port`. A named port is taken as covering nothing: its number is not known here.
pub fn port_covers(rule: &str, observed: &str) -> bool {
    if rule == "any port" {
        return true;
    }
    let (Some((rule_proto, rule_port)), Some((proto, port))) =
        (rule.split_once(' '), observed.split_once(' '))
    else {
        return false;
    };
    if rule_proto != proto {
        return false;
    }
    if rule_port == "any" {
        return true;
    }
    let Ok(port) = port.parse::<i64>() else {
        return false;
    };
    match rule_port.split_once('-') {
        Some((lo, hi)) => match (lo.parse::<i64>(), hi.parse::<i64>()) {
            (Ok(lo), Ok(hi)) => (lo..=hi).contains(&port),
            _ => false,
        },
        None => rule_port.parse::<i64>() == Ok(port),
    }
}
