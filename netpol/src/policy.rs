//! A NetworkPolicy parsed once: whom it isolates for which direction, and what its rules allow.

use crate::peer::{End, Peer};
use crate::port::{Port, PortQuery};
use crate::{Direction, Invalid, Labels};
use k8s_openapi::api::networking::v1::{NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use network_enforcer_api::selector;
use std::borrow::Cow;

/// A NetworkPolicy ready to match connections. Borrowed from its spec, or owned (`'static`) when a
/// caller keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy<'a> {
    pub namespace: Cow<'a, str>,
    pub name: Cow<'a, str>,
    /// `None` selects every pod of the namespace.
    pod_selector: Option<Cow<'a, LabelSelector>>,
    /// The ingress rules, or `None` when the policy does not have the `Ingress` type (after the API
    /// server's defaulting, [`policy_types`]). `Some(vec![])` isolates and allows nothing.
    ingress: Option<Vec<Rule<'a>>>,
    /// The egress rules, likewise.
    egress: Option<Vec<Rule<'a>>>,
}

/// One rule of a direction.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule<'a> {
    /// `None`: every peer (the rule lists none).
    pub peers: Option<Vec<Peer<'a>>>,
    /// `None`: every port of every protocol.
    pub ports: Option<Vec<Port<'a>>>,
}

/// A connection as one side sees it: the other end, and the port.
#[derive(Clone, Copy)]
pub struct Query<'a> {
    /// The destination for egress, the source for ingress.
    pub peer: End<'a>,
    pub port: PortQuery<'a>,
    /// Whether an ipBlock matches a pod by its addresses (see [`Peer::matches`]).
    pub ip_blocks_match_pods: bool,
}

/// `(isolates ingress, isolates egress)`, with the API server's defaulting of an empty or absent
/// `policyTypes`: `Ingress` always, `Egress` when the policy has at least one egress rule (an empty
/// `egress: []` does not count).
pub fn policy_types(spec: &NetworkPolicySpec) -> (bool, bool) {
    match spec.policy_types.as_deref() {
        Some(types) if !types.is_empty() => (
            types.iter().any(|t| t == Direction::Ingress.as_str()),
            types.iter().any(|t| t == Direction::Egress.as_str()),
        ),
        _ => (true, spec.egress.as_ref().is_some_and(|e| !e.is_empty())),
    }
}

impl<'a> Policy<'a> {
    /// Parses the policy `namespace/name` with `spec`, borrowing its names and selectors.
    pub fn parse(namespace: &'a str, name: &'a str, spec: &'a NetworkPolicySpec) -> Self {
        let (ingress, egress) = policy_types(spec);
        Policy {
            namespace: Cow::Borrowed(namespace),
            name: Cow::Borrowed(name),
            pod_selector: spec.pod_selector.as_ref().map(Cow::Borrowed),
            ingress: ingress.then(|| {
                let rules = spec.ingress.iter().flatten();
                rules
                    .map(|r| Rule::parse(r.from.as_deref(), r.ports.as_deref()))
                    .collect()
            }),
            egress: egress.then(|| {
                let rules = spec.egress.iter().flatten();
                rules
                    .map(|r| Rule::parse(r.to.as_deref(), r.ports.as_deref()))
                    .collect()
            }),
        }
    }

    /// The same policy owning all it refers to.
    pub fn into_owned(self) -> Policy<'static> {
        let rules = |rules: Option<Vec<Rule<'a>>>| {
            rules.map(|rules| rules.into_iter().map(Rule::into_owned).collect())
        };
        Policy {
            namespace: Cow::Owned(self.namespace.into_owned()),
            name: Cow::Owned(self.name.into_owned()),
            pod_selector: self.pod_selector.map(|s| Cow::Owned(s.into_owned())),
            ingress: rules(self.ingress),
            egress: rules(self.egress),
        }
    }

    /// The rules of `direction`, or `None` when the policy does not have that type.
    pub fn rules(&self, direction: Direction) -> Option<&[Rule<'a>]> {
        match direction {
            Direction::Ingress => self.ingress.as_deref(),
            Direction::Egress => self.egress.as_deref(),
        }
    }

    /// Whether the policy's `podSelector` selects a pod with `labels` (of its namespace).
    pub fn selects(&self, labels: &Labels) -> bool {
        self.pod_selector
            .as_deref()
            .is_none_or(|s| selector::matches(s, labels))
    }

    /// Whether the policy isolates the pod of `namespace` with `labels` for `direction`.
    pub fn isolates(&self, direction: Direction, namespace: &str, labels: &Labels) -> bool {
        self.rules(direction).is_some() && namespace == self.namespace && self.selects(labels)
    }

    /// Whether one of the policy's rules for `direction` allows `query` (whether the policy isolates
    /// the side's pod is the caller's question: [`Policy::isolates`]).
    pub fn allows(&self, direction: Direction, query: &Query<'_>) -> bool {
        self.rules(direction)
            .is_some_and(|rules| rules.iter().any(|r| r.allows(&self.namespace, query)))
    }

    /// The indexes of the rules for `direction` that allow `query`, in order (rule usage and
    /// explanations; [`Policy::allows`] stops at the first).
    pub fn matching_rules<'q>(
        &'q self,
        direction: Direction,
        query: &'q Query<'q>,
    ) -> impl Iterator<Item = usize> + 'q {
        self.rules(direction)
            .unwrap_or_default()
            .iter()
            .enumerate()
            .filter(|(_, rule)| rule.allows(&self.namespace, query))
            .map(|(i, _)| i)
    }

    /// What in the policy allows nothing because it is invalid, per direction.
    pub fn invalid(&self) -> impl Iterator<Item = &Invalid> {
        let rules = self.ingress.iter().chain(&self.egress).flatten();
        rules.flat_map(|rule| {
            let peers = rule.peers.iter().flatten().filter_map(Peer::invalid);
            let ports = rule.ports.iter().flatten().filter_map(|p| match p {
                Port::Invalid(why) => Some(why),
                _ => None,
            });
            peers.chain(ports)
        })
    }
}

impl<'a> Rule<'a> {
    /// Parses a rule's peers (`from` or `to`) and ports; an absent or empty list allows every peer
    /// (port).
    pub fn parse(
        peers: Option<&'a [NetworkPolicyPeer]>,
        ports: Option<&'a [NetworkPolicyPort]>,
    ) -> Self {
        Rule {
            peers: match peers {
                None | Some([]) => None,
                Some(peers) => Some(peers.iter().map(Peer::parse).collect()),
            },
            ports: match ports {
                None | Some([]) => None,
                Some(ports) => Some(ports.iter().map(Port::parse).collect()),
            },
        }
    }

    /// The same rule owning all it refers to.
    pub fn into_owned(self) -> Rule<'static> {
        Rule {
            peers: self
                .peers
                .map(|peers| peers.into_iter().map(Peer::into_owned).collect()),
            ports: self
                .ports
                .map(|ports| ports.into_iter().map(Port::into_owned).collect()),
        }
    }

    /// Whether the connection's port is one of the rule's ports.
    pub fn ports_match(&self, query: &PortQuery<'_>) -> bool {
        self.ports
            .as_ref()
            .is_none_or(|ports| ports.iter().any(|p| p.matches(query)))
    }

    /// Whether the connection's other end is one of the rule's peers, for a policy of
    /// `policy_namespace`.
    pub fn peers_match(&self, policy_namespace: &str, query: &Query<'_>) -> bool {
        self.peers.as_ref().is_none_or(|peers| {
            peers
                .iter()
                .any(|p| p.matches(policy_namespace, query.peer, query.ip_blocks_match_pods))
        })
    }

    /// Whether the rule allows the connection: its port and its peer match.
    pub fn allows(&self, policy_namespace: &str, query: &Query<'_>) -> bool {
        self.ports_match(&query.port) && self.peers_match(policy_namespace, query)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::PodEnd;
    use crate::{NamedPorts, Protocol};
    use serde_json::{Value, json};
    use std::net::IpAddr;

    fn spec(value: Value) -> NetworkPolicySpec {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn policy_types_default_as_the_api_server_defaults_them() {
        let cases = [
            (json!({}), (true, false)),
            (json!({"egress": []}), (true, false)),
            (json!({"egress": [{}]}), (true, true)),
            (json!({"policyTypes": []}), (true, false)),
            (json!({"policyTypes": ["Egress"]}), (false, true)),
            (json!({"policyTypes": ["Ingress", "Egress"]}), (true, true)),
            (
                json!({"policyTypes": ["Egress"], "ingress": [{}]}),
                (false, true),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(policy_types(&spec(input.clone())), want, "{input}");
            let s = spec(input.clone());
            let p = Policy::parse("a", "p", &s);
            let got = (
                p.rules(Direction::Ingress).is_some(),
                p.rules(Direction::Egress).is_some(),
            );
            assert_eq!(got, want, "parsed {input}");
        }
    }

    struct NoPorts;
    impl NamedPorts for NoPorts {
        fn resolve(&self, _: &str, _: Protocol) -> Option<u16> {
            None
        }
    }

    #[test]
    fn a_policy_isolates_its_namespace_selected_pods_and_its_rules_add_up() {
        let s = spec(json!({
            "podSelector": {"matchLabels": {"app": "db"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": 5432}]},
                {"from": [{"ipBlock": {"cidr": "192.0.2.0/24"}}]},
                {"from": [{}], "ports": [{"port": 5432}]}
            ]
        }));
        let p = Policy::parse("a", "db-in", &s);
        let db: Labels = [("app".to_string(), "db".to_string())].into();
        let web: Labels = [("app".to_string(), "web".to_string())].into();
        let ns: Labels = [("kubernetes.io/metadata.name".to_string(), "a".to_string())].into();
        assert!(p.isolates(Direction::Ingress, "a", &db));
        assert!(
            !p.isolates(Direction::Ingress, "b", &db),
            "another namespace's pod"
        );
        assert!(!p.isolates(Direction::Ingress, "a", &web), "not selected");
        assert!(!p.isolates(Direction::Egress, "a", &db), "no Egress type");

        let ips: [IpAddr; 0] = [];
        let query = |peer, port| Query {
            peer,
            port: PortQuery {
                protocol: Protocol::TCP,
                port,
                destination: Some(&NoPorts),
            },
            ip_blocks_match_pods: true,
        };
        let web_pod = End::Pod(PodEnd {
            namespace: "a",
            namespace_labels: &ns,
            labels: &web,
            ips: &ips,
        });
        let outside = End::Address("192.0.2.7".parse().unwrap());
        let cases = [
            (query(web_pod, 5432), vec![0]),
            (query(web_pod, 80), vec![]),
            (query(outside, 80), vec![1]),
            (
                query(End::Address("198.51.100.1".parse().unwrap()), 5432),
                vec![],
            ),
        ];
        for (i, (q, want)) in cases.iter().enumerate() {
            let got: Vec<usize> = p.matching_rules(Direction::Ingress, q).collect();
            assert_eq!(&got, want, "case {i}");
            assert_eq!(
                p.allows(Direction::Ingress, q),
                !want.is_empty(),
                "case {i}"
            );
        }
        assert_eq!(p.invalid().collect::<Vec<_>>(), vec![&Invalid::EmptyPeer]);
    }
}
