//! Names in a WorkloadNetworkPolicy (`spec.egressNames`, docs/api.md): a connection to an address
//! outside the cluster is allowed when the source pod resolved the address from a name a rule lists
//! (exactly, or under a `*.` wildcard) and the rule's ports allow the port. Which name the pod
//! resolved the address from is the agent's observation (the record's `peer_name`).

use netpol::{PortQuery, Rule};
use network_enforcer_api::dns_name::matches;
use network_enforcer_api::{NameRule, Protocol};

/// Whether `rules` allow a connection on `protocol`/`port` to an address resolved from `name`.
pub fn allows(rules: &[NameRule], name: &str, protocol: Protocol, port: u16) -> bool {
    matching(rules, name, protocol, port).next().is_some()
}

/// The indexes of the `rules` that allow a connection on `protocol`/`port` to an address resolved
/// from `name` (rule usage, docs/api.md).
pub fn matching<'r>(
    rules: &'r [NameRule],
    name: &'r str,
    protocol: Protocol,
    port: u16,
) -> impl Iterator<Item = usize> + 'r {
    // An address outside the cluster is no pod: named ports match nothing.
    let query = PortQuery {
        protocol,
        port,
        destination: None,
    };
    rules.iter().enumerate().filter_map(move |(index, rule)| {
        (rule.names.iter().any(|p| matches(p, name))
            && Rule::parse(None, Some(&rule.ports)).ports_match(&query))
        .then_some(index)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::networking::v1::NetworkPolicyPort;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    #[test]
    fn names_match_exactly_or_below_a_wildcard() {
        let cases = [
            ("api.partner.test", "api.partner.test", true),
            ("api.partner.test", "API.partner.test", false), // both sides are lower-case already
            ("api.partner.test", "x.api.partner.test", false),
            ("*.partner.test", "api.partner.test", true),
            ("*.partner.test", "a.b.partner.test", true),
            ("*.partner.test", "partner.test", false),
            ("*.partner.test", "evilpartner.test", false),
            ("*.partner.test", ".partner.test", false),
            ("*.partner.test", "api.partner.test.evil", false),
        ];
        for (pattern, name, want) in cases {
            assert_eq!(matches(pattern, name), want, "{pattern} vs {name}");
        }
    }

    #[test]
    fn a_rule_needs_the_name_and_the_port() {
        let port = |p: i32, end: Option<i32>, proto: &str| NetworkPolicyPort {
            protocol: Some(proto.into()),
            port: Some(IntOrString::Int(p)),
            end_port: end,
        };
        let rules = [
            NameRule {
                names: vec!["api.partner.test".into()],
                ports: vec![port(443, None, "TCP")],
            },
            NameRule {
                names: vec!["*.storage.partner.test".into()],
                ports: vec![port(8000, Some(8100), "TCP"), port(53, None, "UDP")],
            },
            NameRule {
                names: vec!["any-port.partner.test".into()],
                ports: vec![],
            },
        ];
        let cases = [
            ("api.partner.test", Protocol::TCP, 443, true),
            ("api.partner.test", Protocol::TCP, 80, false),
            ("api.partner.test", Protocol::UDP, 443, false),
            ("eu.storage.partner.test", Protocol::TCP, 8050, true),
            ("eu.storage.partner.test", Protocol::UDP, 53, true),
            ("eu.storage.partner.test", Protocol::TCP, 8101, false),
            ("any-port.partner.test", Protocol::UDP, 9, true),
            ("other.partner.test", Protocol::TCP, 443, false),
        ];
        for (name, protocol, p, want) in cases {
            assert_eq!(
                allows(&rules, name, protocol, p),
                want,
                "{name} {protocol:?}/{p}"
            );
        }
    }

    #[test]
    fn every_rule_that_allows_is_named_for_rule_usage() {
        let rule = |names: &[&str], port: Option<i32>| NameRule {
            names: names.iter().map(|n| n.to_string()).collect(),
            ports: port
                .map(|p| NetworkPolicyPort {
                    protocol: Some("TCP".into()),
                    port: Some(IntOrString::Int(p)),
                    end_port: None,
                })
                .into_iter()
                .collect(),
        };
        let rules = [
            rule(&["api.partner.test"], Some(443)),
            rule(&["*.partner.test"], Some(443)),
            rule(&["api.partner.test"], Some(80)),
            rule(&["other.test", "api.partner.test"], None),
        ];
        let cases: [(&str, u16, &[usize]); 4] = [
            ("api.partner.test", 443, &[0, 1, 3]),
            ("api.partner.test", 80, &[2, 3]),
            ("eu.partner.test", 443, &[1]),
            ("eu.partner.test", 80, &[]),
        ];
        for (name, port, want) in cases {
            let got: Vec<usize> = matching(&rules, name, Protocol::TCP, port).collect();
            assert_eq!(got, want, "{name}:{port}");
        }
    }
}
