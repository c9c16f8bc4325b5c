//! `check --propose-cluster-policies`: the ClusterNetworkPolicies the scenario's flows need
//! ([`crate::learn::cluster_policies`]), checked against the scenario itself: a flow the scenario's
//! policies allow must still be allowed with the proposals in force (else the proposals are not
//! printed: that would be a defect of ours, reported as one).

use super::*;
use crate::learn::cluster_policies::{self, EdgeEnd, NamespaceEdge, Proposed, Settings};

/// The proposals for `scenario`'s flows, after checking that they take nothing away.
pub fn propose_cluster_policies(scenario: &Scenario) -> Result<Proposed, CheckError> {
    let pods: HashMap<IpAddr, &str> = scenario
        .pods
        .iter()
        .filter_map(|p| Some((p.ip?, p.namespace.as_str())))
        .collect();
    let namespace_of = |peer: &ScenarioPeer| -> Option<EdgeEnd> {
        match (&peer.pod, peer.ip) {
            (Some(pod), _) => Some(EdgeEnd::Namespace(pod.split_once('/')?.0.to_string())),
            (None, Some(ip)) => Some(match pods.get(&ip) {
                Some(ns) => EdgeEnd::Namespace(ns.to_string()),
                None => EdgeEnd::Address(ip),
            }),
            (None, None) => None,
        }
    };
    let mut edges: Vec<NamespaceEdge> = scenario
        .flows
        .iter()
        .filter_map(|f| match (namespace_of(&f.from)?, namespace_of(&f.to)?) {
            (EdgeEnd::Namespace(from), to) => Some(NamespaceEdge { from, to }),
            // A flow from an address has no source namespace to propose for.
            (EdgeEnd::Address(_), _) => None,
        })
        .collect();
    edges.sort();
    edges.dedup();
    let proposed = cluster_policies::propose(&edges, &Settings::default());

    let before = Checker::new(scenario.clone())?.run();
    let mut with = scenario.clone();
    for policy in &proposed.policies {
        let value = serde_json::to_value(policy)
            .map_err(|e| CheckError::new("proposals", e.to_string()))?;
        with.policies.push(value);
    }
    let after = Checker::new(with)?.run();
    let taken: Vec<String> = before
        .results
        .iter()
        .zip(&after.results)
        .filter(|(b, a)| b.allowed && !a.allowed)
        .map(|(b, _)| {
            format!(
                "{} -> {} {}/{}",
                render::peer_text(&b.from),
                render::peer_text(&b.to),
                b.protocol,
                b.port
            )
        })
        .collect();
    if !taken.is_empty() {
        return Err(CheckError::new(
            "flows",
            format!(
                "the proposed ClusterNetworkPolicies would deny flows the scenario allows (a defect: \
                 please report it): {}",
                taken.join(", ")
            ),
        ));
    }
    Ok(proposed)
}
