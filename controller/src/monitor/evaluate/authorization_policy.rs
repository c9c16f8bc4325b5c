//! Whether the Istio AuthorizationPolicy a WorkloadNetworkPolicy renders (`action: ALLOW`, the
//! `spec.istio` selector and rules 1:1) allows a connection, with ztunnel's L4 semantics:
//!
//! - the policy applies to the destination pods its selector selects; ztunnel enforces TCP only, so
//!   UDP and SCTP are never subject to it;
//! - an ALLOW policy with no rules allows nothing; otherwise a connection is allowed when any rule
//!   matches;
//! - a rule matches when one of its `from` entries and one of its `to` entries match (an absent list
//!   matches anything); inside an entry, an absent or empty field is no constraint;
//! - a principal is matched exactly, as a prefix (`cluster.local/ns/shop/*`), a suffix
//!   (`*/sa/frontend`), or `*`: any authenticated peer. A peer without a mesh identity (plaintext)
//!   matches no principal constraint, not even `*`;
//! - a port is `"8080"` or a range `"8000-8099"`; anything else matches nothing.

use super::view::Labels;
use network_enforcer_api::selector;
use network_enforcer_api::{IstioPolicy, IstioRule, Protocol};

/// The SPIFFE scheme ztunnel may prefix identities with; our principals are written without it.
const SPIFFE_SCHEME: &str = "spiffe://";

/// A connection as ztunnel sees it at the destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Connection<'a> {
    /// The labels of the destination pod.
    pub destination_labels: &'a Labels,
    /// The source's mesh identity (`cluster.local/ns/<ns>/sa/<sa>`, with or without `spiffe://`);
    /// `None` for a peer without one.
    pub source_principal: Option<&'a str>,
    pub protocol: Protocol,
    /// The destination (container) port.
    pub port: u16,
}

/// What the policy says about a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthzVerdict {
    /// The policy does not govern the connection (another workload, or not TCP).
    NotApplicable,
    Allowed,
    Denied,
}

/// Evaluates `connection` against the AuthorizationPolicy rendered from `policy`.
pub fn evaluate(policy: &IstioPolicy, connection: &Connection<'_>) -> AuthzVerdict {
    // The renderer refuses selectors that do not translate exactly, so the LabelSelector selects
    // the same pods as the rendered matchLabels.
    if connection.protocol != Protocol::TCP
        || !selector::matches(&policy.selector, connection.destination_labels)
    {
        return AuthzVerdict::NotApplicable;
    }
    let principal = principal(connection);
    if policy
        .rules
        .iter()
        .any(|rule| rule_matches(rule, principal, connection.port))
    {
        AuthzVerdict::Allowed
    } else {
        AuthzVerdict::Denied
    }
}

/// The indexes of the rules of `policy` that match `connection`, in order; empty when the policy
/// does not govern it or no rule matches. For explanations (`check --explain`, docs/operations.md):
/// [`evaluate`] stops at the first matching rule.
pub fn matching_rules(policy: &IstioPolicy, connection: &Connection<'_>) -> Vec<usize> {
    if evaluate(policy, connection) != AuthzVerdict::Allowed {
        return Vec::new();
    }
    let principal = principal(connection);
    policy
        .rules
        .iter()
        .enumerate()
        .filter(|(_, rule)| rule_matches(rule, principal, connection.port))
        .map(|(i, _)| i)
        .collect()
}

/// The source's identity without ztunnel's `spiffe://` scheme; `None` without one (plaintext).
fn principal<'a>(connection: &Connection<'a>) -> Option<&'a str> {
    connection
        .source_principal
        .map(|p| p.strip_prefix(SPIFFE_SCHEME).unwrap_or(p))
        .filter(|p| !p.is_empty())
}

fn rule_matches(rule: &IstioRule, principal: Option<&str>, port: u16) -> bool {
    let from_ok = rule.from.is_empty()
        || rule.from.iter().any(|from| {
            let principals = &from.source.principals;
            principals.is_empty()
                || principal.is_some_and(|p| principals.iter().any(|m| principal_matches(m, p)))
        });
    let to_ok = rule.to.is_empty()
        || rule.to.iter().any(|to| {
            let ports = &to.operation.ports;
            ports.is_empty() || ports.iter().any(|p| port_matches(p, port))
        });
    from_ok && to_ok
}

/// Istio's string match for principals: `*` (present), `prefix*`, `*suffix`, or exact.
fn principal_matches(pattern: &str, principal: &str) -> bool {
    let pattern = pattern.strip_prefix(SPIFFE_SCHEME).unwrap_or(pattern);
    if pattern == "*" {
        true
    } else if let Some(prefix) = pattern.strip_suffix('*') {
        principal.starts_with(prefix)
    } else if let Some(suffix) = pattern.strip_prefix('*') {
        principal.ends_with(suffix)
    } else {
        pattern == principal
    }
}

/// `"8080"` or `"8000-8099"` (inclusive); a malformed entry matches nothing.
fn port_matches(pattern: &str, port: u16) -> bool {
    let parse = |s: &str| s.trim().parse::<u16>().ok();
    match pattern.split_once('-') {
        None => parse(pattern) == Some(port),
        Some((lo, hi)) => match (parse(lo), parse(hi)) {
            (Some(lo), Some(hi)) => (lo..=hi).contains(&port),
            _ => false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CLIENT: &str = "cluster.local/ns/shop/sa/http-client-sa";

    fn policy(v: serde_json::Value) -> IstioPolicy {
        serde_json::from_value(v).unwrap()
    }

    /// The end-to-end scenario's policy (istio): http-client may reach http-server on 18080.
    fn spec10() -> IstioPolicy {
        policy(json!({
            "selector": {"matchLabels": {"app": "http-server"}},
            "rules": [{"from": [{"source": {"principals": [CLIENT]}}],
                       "to": [{"operation": {"ports": ["18080"]}}]}]
        }))
    }

    fn server() -> Labels {
        Labels::from([("app".into(), "http-server".into())])
    }

    fn conn<'a>(
        labels: &'a Labels,
        principal: Option<&'a str>,
        protocol: Protocol,
        port: u16,
    ) -> Connection<'a> {
        Connection {
            destination_labels: labels,
            source_principal: principal,
            protocol,
            port,
        }
    }

    #[test]
    fn the_istio_scenario() {
        let labels = server();
        let p = spec10();
        assert_eq!(
            evaluate(&p, &conn(&labels, Some(CLIENT), Protocol::TCP, 18080)),
            AuthzVerdict::Allowed
        );
        assert_eq!(
            evaluate(&p, &conn(&labels, Some(CLIENT), Protocol::TCP, 18082)),
            AuthzVerdict::Denied
        );
        let spiffe = format!("spiffe://{CLIENT}");
        assert_eq!(
            evaluate(&p, &conn(&labels, Some(&spiffe), Protocol::TCP, 18080)),
            AuthzVerdict::Allowed,
            "ztunnel's spiffe:// prefix is the same identity"
        );
        assert_eq!(
            evaluate(
                &p,
                &conn(
                    &labels,
                    Some("cluster.local/ns/shop/sa/other"),
                    Protocol::TCP,
                    18080
                )
            ),
            AuthzVerdict::Denied
        );
    }

    #[test]
    fn only_tcp_to_selected_pods_is_governed() {
        let p = spec10();
        let labels = server();
        assert_eq!(
            evaluate(&p, &conn(&labels, Some(CLIENT), Protocol::UDP, 18081)),
            AuthzVerdict::NotApplicable
        );
        let other = Labels::from([("app".into(), "db".into())]);
        assert_eq!(
            evaluate(&p, &conn(&other, Some(CLIENT), Protocol::TCP, 1)),
            AuthzVerdict::NotApplicable
        );
    }

    #[test]
    fn selector_expressions_are_honoured() {
        let p = policy(json!({
            "selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["http-server"]}]},
            "rules": [{}]
        }));
        let labels = server();
        assert_eq!(
            evaluate(&p, &conn(&labels, None, Protocol::TCP, 1)),
            AuthzVerdict::Allowed
        );
        let other = Labels::from([("app".into(), "db".into())]);
        assert_eq!(
            evaluate(&p, &conn(&other, None, Protocol::TCP, 1)),
            AuthzVerdict::NotApplicable
        );
    }

    #[test]
    fn no_rules_allow_nothing_and_an_empty_rule_allows_everything() {
        let labels = server();
        let none = policy(json!({"selector": {"matchLabels": {"app": "http-server"}}}));
        assert_eq!(
            evaluate(&none, &conn(&labels, Some(CLIENT), Protocol::TCP, 80)),
            AuthzVerdict::Denied
        );
        let all =
            policy(json!({"selector": {"matchLabels": {"app": "http-server"}}, "rules": [{}]}));
        assert_eq!(
            evaluate(&all, &conn(&labels, None, Protocol::TCP, 80)),
            AuthzVerdict::Allowed
        );
    }

    #[test]
    fn principal_patterns() {
        let cases = [
            ("*", Some(CLIENT), true),
            ("*", None, false),
            ("*", Some(""), false),
            ("cluster.local/ns/shop/*", Some(CLIENT), true),
            ("cluster.local/ns/bank/*", Some(CLIENT), false),
            ("*/sa/http-client-sa", Some(CLIENT), true),
            ("*/sa/other", Some(CLIENT), false),
            (CLIENT, Some(CLIENT), true),
            (
                "spiffe://cluster.local/ns/shop/sa/http-client-sa",
                Some(CLIENT),
                true,
            ),
            ("cluster.local/ns/shop/sa/http-client", Some(CLIENT), false),
        ];
        let labels = server();
        for (pattern, principal, expected) in cases {
            let p = policy(json!({
                "selector": {"matchLabels": {"app": "http-server"}},
                "rules": [{"from": [{"source": {"principals": [pattern]}}]}]
            }));
            let got = evaluate(&p, &conn(&labels, principal, Protocol::TCP, 80));
            assert_eq!(
                got == AuthzVerdict::Allowed,
                expected,
                "{pattern} vs {principal:?}"
            );
        }
    }

    #[test]
    fn port_patterns() {
        let cases = [
            ("8080", 8080, true),
            ("8080", 8081, false),
            ("8000-8099", 8000, true),
            ("8000-8099", 8099, true),
            ("8000-8099", 8100, false),
            ("8099-8000", 8050, false),
            ("http", 80, false),
            ("80-", 80, false),
            ("70000", 4464, false),
        ];
        let labels = server();
        for (pattern, port, expected) in cases {
            let p = policy(json!({
                "selector": {"matchLabels": {"app": "http-server"}},
                "rules": [{"to": [{"operation": {"ports": [pattern]}}]}]
            }));
            let got = evaluate(&p, &conn(&labels, None, Protocol::TCP, port));
            assert_eq!(
                got == AuthzVerdict::Allowed,
                expected,
                "{pattern} vs {port}"
            );
        }
    }

    #[test]
    fn rules_add_up_and_from_and_to_are_anded() {
        let labels = server();
        let p = policy(json!({
            "selector": {"matchLabels": {"app": "http-server"}},
            "rules": [
                {"from": [{"source": {"principals": ["cluster.local/ns/a/sa/x"]}},
                          {"source": {"principals": ["cluster.local/ns/b/sa/y"]}}],
                 "to": [{"operation": {"ports": ["80"]}}, {"operation": {"ports": ["443"]}}]},
                {"from": [{"source": {"principals": ["cluster.local/ns/c/sa/z"]}}]}
            ]
        }));
        let allowed = |principal: &str, port| {
            evaluate(&p, &conn(&labels, Some(principal), Protocol::TCP, port))
                == AuthzVerdict::Allowed
        };
        assert!(allowed("cluster.local/ns/a/sa/x", 80));
        assert!(allowed("cluster.local/ns/b/sa/y", 443));
        assert!(!allowed("cluster.local/ns/b/sa/y", 8080));
        assert!(
            allowed("cluster.local/ns/c/sa/z", 8080),
            "second rule, any port"
        );
        assert!(!allowed("cluster.local/ns/d/sa/w", 80));
    }

    /// The explanation names every matching rule, and none when the policy does not allow.
    #[test]
    fn matching_rules_name_the_rules_that_allow() {
        let labels = server();
        let p = policy(json!({
            "selector": {"matchLabels": {"app": "http-server"}},
            "rules": [
                {"to": [{"operation": {"ports": ["80"]}}]},
                {"from": [{"source": {"principals": ["cluster.local/ns/a/*"]}}]},
                {"from": [{"source": {"principals": ["*"]}}], "to": [{"operation": {"ports": ["80-90"]}}]}
            ]
        }));
        let cases: [(Option<&str>, Protocol, u16, &[usize]); 6] = [
            (
                Some("spiffe://cluster.local/ns/a/sa/x"),
                Protocol::TCP,
                80,
                &[0, 1, 2],
            ),
            (Some("cluster.local/ns/a/sa/x"), Protocol::TCP, 443, &[1]),
            (Some("cluster.local/ns/b/sa/y"), Protocol::TCP, 85, &[2]),
            (None, Protocol::TCP, 80, &[0]),
            (None, Protocol::TCP, 85, &[]),
            (Some("cluster.local/ns/a/sa/x"), Protocol::UDP, 80, &[]),
        ];
        for (principal, protocol, port, expected) in cases {
            let connection = conn(&labels, principal, protocol, port);
            assert_eq!(
                matching_rules(&p, &connection),
                expected,
                "{principal:?} {protocol:?}/{port}"
            );
            assert_eq!(
                evaluate(&p, &connection) == AuthzVerdict::Allowed,
                !expected.is_empty(),
                "{principal:?} {protocol:?}/{port}: the verdict agrees"
            );
        }
    }

    #[test]
    fn an_empty_principal_list_is_no_constraint() {
        let labels = server();
        let p = policy(json!({
            "selector": {"matchLabels": {"app": "http-server"}},
            "rules": [{"from": [{"source": {"principals": []}}], "to": [{"operation": {"ports": []}}]}]
        }));
        assert_eq!(
            evaluate(&p, &conn(&labels, None, Protocol::TCP, 9)),
            AuthzVerdict::Allowed
        );
    }
}
