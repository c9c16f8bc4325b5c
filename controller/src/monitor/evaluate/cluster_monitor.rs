//! Cluster proposals in monitor (docs/behaviour.md §4.9): which of them would deny an observed flow.
//!
//! The proposals' ClusterNetworkPolicies are added to the view as if they were in force (each in the
//! place of an in-force one of its name), the flow is evaluated through the tiers
//! ([`super::compiled::evaluate`]), and a side whose deciding rule is a Deny of a monitored proposal
//! is that proposal's violation, `action: monitor`, `direction` the side's. The source's egress is
//! judged first: a flow stopped at its source (by a proposal or by anything else) never reaches the
//! destination, so its ingress is not judged. A side that a NetworkPolicy, a Pass or an Accept, or a
//! ClusterNetworkPolicy in force decides is no proposal's doing, so no violation of one.
//!
//! All monitored proposals are evaluated together, as if all were promoted to protect: what one
//! records is what the cluster would deny with every monitored proposal in force.

use super::EvalError;
use super::attribution::{Attributed, ObservedFlow, Recorder, flow_of_record};
use super::compiled;
use super::verdict::FlowVerdict;
use super::view::{ClusterView, NamedClusterPolicy};
use netpol::cluster::Action;
use network_enforcer_api::cluster_network_policy::ClusterNetworkPolicySpec;
use network_enforcer_api::{Direction, PolicyMode, ViolationRecord};
use std::collections::BTreeSet;

/// The view with the monitored proposals in force, and their names.
#[derive(Debug)]
pub struct Monitored {
    view: ClusterView,
    names: BTreeSet<String>,
}

impl Monitored {
    /// `view` with `proposals` added; `None` without any, so that a cluster without monitored
    /// proposals evaluates nothing more.
    pub fn new(
        view: &ClusterView,
        proposals: impl IntoIterator<Item = NamedClusterPolicy>,
    ) -> Option<Self> {
        let mut proposals = proposals.into_iter().peekable();
        proposals.peek()?;
        let mut view = view.clone();
        let mut names = BTreeSet::new();
        for proposal in proposals {
            names.insert(proposal.name.clone());
            view.insert_cluster_policy(proposal);
        }
        Some(Monitored { view, names })
    }

    /// The names of the monitored proposals.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    /// Whether this judges proposal `name` by `spec` (it is monitored, with that spec).
    pub fn judges(&self, name: &str, spec: &ClusterNetworkPolicySpec) -> bool {
        self.names.contains(name)
            && self
                .view
                .cluster_policies()
                .iter()
                .any(|p| p.name == name && p.spec == *spec)
    }

    /// The violation a monitored proposal would record for `flow`, if one would deny it.
    pub fn denial<'a>(
        &'a self,
        flow: &'a ObservedFlow,
    ) -> Result<Option<Attributed<'a>>, EvalError> {
        let verdict = compiled::evaluate(&self.view, &flow.flow())?;
        Ok(self.denier(&verdict).map(|(name, direction)| Attributed {
            by: Recorder {
                namespace: "",
                name,
                mode: PolicyMode::Monitor,
                direction,
            },
            flow,
        }))
    }

    /// Whether the proposal that recorded `record` no longer denies its flow on the record's side
    /// (the "clear" step, docs/behaviour.md §3.7): the record's workloads stand for their first pod
    /// now; a flow that cannot be rebuilt is not cleared.
    pub fn allows_now(&self, record: &ViolationRecord) -> bool {
        let Some(flow) = flow_of_record(&self.view, record) else {
            return false;
        };
        match compiled::evaluate(&self.view, &flow) {
            Ok(verdict) => self.denier(&verdict).is_none_or(|(name, direction)| {
                name != record.denying_policy_name || Some(direction) != record.direction
            }),
            Err(_) => false,
        }
    }

    /// The monitored proposal whose Deny decides a side of `verdict`, and that side: the egress
    /// first; a side denied by anything else stops the judgement there.
    fn denier(&self, verdict: &FlowVerdict) -> Option<(&str, Direction)> {
        for direction in [Direction::Egress, Direction::Ingress] {
            let side = verdict.side(direction);
            if side.allowed {
                continue;
            }
            let tier = side.decider.tier()?;
            return side
                .cluster
                .iter()
                .find(|step| step.tier == tier && step.action == Action::Deny)
                .and_then(|step| self.names.get(&step.policy))
                .map(|name| (name.as_str(), direction));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::evaluate::attribution::FlowSide;
    use crate::monitor::evaluate::compiled::tests::cnp;
    use crate::monitor::evaluate::network_policy::tests::{endpoint, fixture, flow, np};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use network_enforcer_api::WorkloadRef;
    use serde_json::json;

    /// `"shop/web-1 -> shop/api-1 TCP/9000"` as an observed flow.
    fn observed(s: &str) -> ObservedFlow {
        let f = flow(s);
        let side = |endpoint| FlowSide {
            endpoint,
            workload: WorkloadRef::default().into(),
        };
        ObservedFlow {
            source: side(f.source),
            destination: side(f.destination),
            protocol: f.protocol,
            port: f.port,
            seen_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            peer_name: None,
        }
    }

    /// Which proposal would record which flow, on which side, with the tiers around it.
    #[test]
    fn a_monitored_proposal_records_what_it_would_deny_and_nothing_else() {
        let mut view = fixture();
        // In force: a NetworkPolicy isolating shop/api-1 (ingress from shop only), and an Admin
        // policy that denies dev's egress to bank.
        view.insert_policy(np(
            "shop",
            "api-from-shop",
            json!({"podSelector": {"matchLabels": {"app": "api"}},
                   "ingress": [{"from": [{"podSelector": {}}]}]}),
        ));
        view.insert_cluster_policy(cnp(
            "dev-not-bank",
            json!({"tier": "Admin", "priority": 5,
                   "subject": {"namespaces": {"matchLabels": {"env": "dev"}}},
                   "egress": [{"action": "Deny",
                               "to": [{"namespaces": {"matchLabels": {"team": "b"}}}]}]}),
        ));
        // Monitored: shop's isolation (Pass from shop, Deny the rest) and dev's floor (DNS, then
        // Deny everything).
        let isolate = cnp(
            "ne-isolate-shop",
            json!({"tier": "Admin", "priority": 900,
                   "subject": {"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": "shop"}}},
                   "ingress": [
                       {"action": "Pass", "from": [{"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": "shop"}}}]},
                       {"action": "Deny", "from": [{"namespaces": {}}]}]}),
        );
        let floor = cnp(
            "ne-floor-dev",
            json!({"tier": "Baseline", "priority": 900,
                   "subject": {"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": "dev"}}},
                   "egress": [
                       {"action": "Accept", "to": [{"pods": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                                                         "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}}],
                        "protocols": [{"udp": {"destinationPort": {"number": 53}}}]},
                       {"action": "Deny", "to": [{"networks": ["0.0.0.0/0"]}]},
                       {"action": "Deny", "to": [{"namespaces": {}}]}]}),
        );
        assert!(Monitored::new(&view, []).is_none(), "nothing monitored");
        let monitored = Monitored::new(&view, [isolate, floor]).unwrap();
        // (flow, the proposal and side that records it)
        let cases = [
            // Inside shop: Passed to the NetworkPolicy, which allows it.
            ("shop/web-1 -> shop/api-1 TCP/9000", None),
            // Another namespace into shop: the isolation denies it at shop's ingress.
            (
                "bank/web-1 -> shop/db-1 TCP/5432",
                Some(("ne-isolate-shop", Direction::Ingress)),
            ),
            // From dev: dev's floor denies it at the source first; shop's ingress never sees it.
            (
                "dev/web-1 -> shop/db-1 TCP/5432",
                Some(("ne-floor-dev", Direction::Egress)),
            ),
            // dev's DNS: accepted by the floor.
            ("dev/web-1 -> kube-system/dns-1 UDP/53", None),
            // dev to an outside address: the floor's networks rule.
            (
                "dev/web-1 -> 198.51.100.7 TCP/443",
                Some(("ne-floor-dev", Direction::Egress)),
            ),
            // dev to bank: the Admin policy in force denies it first: not the proposal's doing.
            ("dev/web-1 -> bank/web-1 TCP/8080", None),
            // Subjects of neither proposal.
            ("bank/web-1 -> kube-system/dns-1 UDP/53", None),
            ("203.0.113.9 -> bank/web-1 TCP/8080", None),
        ];
        for (f, expected) in cases {
            let flow = observed(f);
            let found = monitored
                .denial(&flow)
                .unwrap()
                .map(|a| (a.by.name, a.by.direction, a.by.mode, a.by.namespace));
            assert_eq!(
                found,
                expected.map(|(name, direction)| (name, direction, PolicyMode::Monitor, "")),
                "{f}"
            );
        }
        // A NetworkPolicy that isolates shop/db-1 decides after the Pass, so the floor is not
        // reached and the isolation is not what denies a flow from shop.
        let mut with_np = fixture();
        with_np.insert_policy(np(
            "shop",
            "db-closed",
            json!({"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress"]}),
        ));
        let monitored = Monitored::new(
            &with_np,
            [cnp(
                "ne-isolate-shop",
                json!({"tier": "Admin", "priority": 900,
                       "subject": {"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": "shop"}}},
                       "ingress": [
                           {"action": "Pass", "from": [{"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": "shop"}}}]},
                           {"action": "Deny", "from": [{"namespaces": {}}]}]}),
            )],
        )
        .unwrap();
        let flow = observed("shop/web-1 -> shop/db-1 TCP/5432");
        assert!(monitored.denial(&flow).unwrap().is_none());
        assert_eq!(monitored.names().collect::<Vec<_>>(), ["ne-isolate-shop"]);
        let unknown = ObservedFlow {
            source: FlowSide {
                endpoint: endpoint("shop/gone-1"),
                workload: WorkloadRef::default().into(),
            },
            ..flow
        };
        assert!(monitored.denial(&unknown).is_err(), "an unknown pod");
    }

    /// The "clear" step: a record stays while its proposal still denies its flow on its side, and
    /// goes once the proposal (edited) no longer does; a flow that cannot be rebuilt stays.
    #[test]
    fn a_record_is_cleared_once_its_proposal_no_longer_denies_it() {
        let isolate = |passed: &[&str]| {
            cnp(
                "ne-isolate-shop",
                json!({"tier": "Admin", "priority": 900,
                       "subject": {"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": "shop"}}},
                       "ingress": [
                           {"action": "Pass", "from": [{"namespaces": {"matchExpressions": [
                               {"key": "kubernetes.io/metadata.name", "operator": "In", "values": passed}]}}]},
                           {"action": "Deny", "from": [{"namespaces": {}}]}]}),
            )
        };
        let workload = |namespace: &str, name: &str| WorkloadRef {
            namespace: namespace.into(),
            owner_kind: "Deployment".into(),
            owner_name: name.into(),
            ..WorkloadRef::default()
        };
        let record = ViolationRecord {
            id: 0,
            timestamp: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            source: workload("bank", "web"),
            dest: workload("shop", "db"),
            protocol: network_enforcer_api::Protocol::TCP,
            dst_port: Some(5432),
            action: PolicyMode::Monitor,
            direction: Some(Direction::Ingress),
            denying_policy_namespace: String::new(),
            denying_policy_name: "ne-isolate-shop".into(),
        };
        let view = fixture();
        let denying = Monitored::new(&view, [isolate(&["shop"])]).unwrap();
        assert!(!denying.allows_now(&record), "still denied");
        let passing = Monitored::new(&view, [isolate(&["shop", "bank"])]).unwrap();
        assert!(passing.allows_now(&record), "bank is passed now");
        let gone = ViolationRecord {
            source: workload("bank", "gone"),
            ..record.clone()
        };
        assert!(
            !passing.allows_now(&gone),
            "no pod to rebuild the flow from"
        );
        let egress = ViolationRecord {
            direction: Some(Direction::Egress),
            ..record
        };
        assert!(denying.allows_now(&egress), "denied on the other side only");
    }
}
