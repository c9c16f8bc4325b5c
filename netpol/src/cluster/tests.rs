//! ClusterNetworkPolicy semantics, table-driven, from the v1alpha2 API reference: tiers, actions,
//! rule order, priority and ties, peers, protocols and failing closed.

use super::*;
use crate::peer::PodEnd;
use crate::port::{NamedPorts, PortQuery};
use serde_json::{Value, json};
use std::net::IpAddr;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Namespaces: `tenant-a` (tenant=a), `tenant-b` (tenant=b), `kube-system`.
fn namespace(name: &str) -> Labels {
    let mut l = labels(&[("kubernetes.io/metadata.name", name)]);
    match name {
        "tenant-a" => l.insert("tenant".into(), "a".into()),
        "tenant-b" => l.insert("tenant".into(), "b".into()),
        _ => None,
    };
    l
}

struct Ports;
impl NamedPorts for Ports {
    fn resolve(&self, name: &str, protocol: Protocol) -> Option<u16> {
        match (name, protocol) {
            ("http", Protocol::TCP) => Some(8080),
            ("dns", Protocol::UDP) => Some(5353),
            _ => None,
        }
    }
}

/// A pod of `ns` with `app=<app>` at `ip`.
struct Pod {
    ns: Labels,
    labels: Labels,
    ips: Vec<IpAddr>,
    namespace: &'static str,
}

fn pod(namespace: &'static str, app: &str, ip: &str) -> Pod {
    Pod {
        ns: namespace_labels(namespace),
        labels: labels(&[("app", app)]),
        ips: vec![ip.parse().unwrap()],
        namespace,
    }
}

fn namespace_labels(name: &str) -> Labels {
    namespace(name)
}

impl Pod {
    fn end(&self) -> End<'_> {
        End::Pod(PodEnd {
            namespace: self.namespace,
            namespace_labels: &self.ns,
            labels: &self.labels,
            ips: &self.ips,
        })
    }
}

fn query<'a>(peer: End<'a>, protocol: Protocol, port: u16) -> Query<'a> {
    Query {
        peer,
        port: PortQuery {
            protocol,
            port,
            destination: Some(&Ports),
        },
        ip_blocks_match_pods: true,
    }
}

fn spec(value: Value) -> ClusterNetworkPolicySpec {
    serde_json::from_value(value).unwrap()
}

/// One side's verdict through the tiers: the cluster policies selecting `subject`, by tier and
/// precedence, with `network_policy` the NetworkPolicy tier's answer.
fn side(
    specs: &[(&str, ClusterNetworkPolicySpec)],
    subject: &Pod,
    direction: Direction,
    network_policy: Option<bool>,
    q: &Query<'_>,
) -> (bool, Decider, Vec<String>) {
    let mut policies: Vec<ClusterPolicy> = specs
        .iter()
        .map(|(name, spec)| ClusterPolicy::parse(name, spec).unwrap())
        .filter(|p| p.selects(&subject.ns, &subject.labels))
        .collect();
    policies.sort_by(|a, b| a.precedence().cmp(&b.precedence()));
    let tier = |tier| first_match(policies.iter().filter(|p| p.tier == tier), direction, q);
    let admin = tier(Tier::Admin);
    let baseline = tier(Tier::Baseline);
    let trail = [admin, baseline]
        .into_iter()
        .flatten()
        .map(|m| format!("{} rule {} {}", m.policy.name, m.rule, m.action))
        .collect();
    let (allowed, decider) = combine(
        admin.map(|m| m.action),
        network_policy,
        baseline.map(|m| m.action),
    );
    (allowed, decider, trail)
}

fn admin(priority: i32, subject: Value, egress: Value) -> ClusterNetworkPolicySpec {
    spec(json!({"tier": "Admin", "priority": priority, "subject": subject, "egress": egress}))
}

fn baseline(subject: Value, egress: Value) -> ClusterNetworkPolicySpec {
    spec(json!({"tier": "Baseline", "priority": 0, "subject": subject, "egress": egress}))
}

#[test]
fn tiers_combine_admin_then_network_policy_then_baseline() {
    use Action::*;
    let cases = [
        (Some(Accept), Some(false), None, (true, Decider::Admin)),
        (
            Some(Deny),
            Some(true),
            Some(Accept),
            (false, Decider::Admin),
        ),
        (
            Some(Pass),
            Some(false),
            Some(Accept),
            (false, Decider::NetworkPolicy),
        ),
        (None, Some(true), Some(Deny), (true, Decider::NetworkPolicy)),
        (Some(Pass), None, Some(Deny), (false, Decider::Baseline)),
        (None, None, Some(Accept), (true, Decider::Baseline)),
        (None, None, Some(Pass), (true, Decider::Default)),
        (None, None, None, (true, Decider::Default)),
    ];
    for (a, np, b, want) in cases {
        assert_eq!(combine(a, np, b), want, "{a:?} {np:?} {b:?}");
    }
}

#[test]
fn rules_decide_in_order_of_priority_then_name_then_rule() {
    let client = pod("tenant-a", "client", "10.0.0.1");
    let server = pod("tenant-b", "server", "10.0.1.1");
    let all_ns = json!({"namespaces": {}});
    let to_b = json!([{"namespaces": {"matchLabels": {"tenant": "b"}}}]);
    let specs = [
        // Priority 20: would accept, but priority 10 decides first.
        (
            "accept-b",
            admin(
                20,
                all_ns.clone(),
                json!([{"action": "Accept", "to": to_b}]),
            ),
        ),
        // Priority 10: first rule does not match the port, the second denies.
        (
            "isolate",
            admin(
                10,
                all_ns.clone(),
                json!([
                    {"action": "Pass", "to": to_b, "protocols": [{"tcp": {"destinationPort": {"number": 53}}}]},
                    {"action": "Deny", "to": to_b}
                ]),
            ),
        ),
    ];
    let q = query(server.end(), Protocol::TCP, 80);
    let (allowed, decider, trail) = side(&specs, &client, Direction::Egress, None, &q);
    assert_eq!((allowed, decider), (false, Decider::Admin));
    assert_eq!(trail, vec!["isolate rule 1 Deny"]);
    // Port 53 passes to the next tier; no NetworkPolicy, no baseline: allowed by default.
    let q = query(server.end(), Protocol::TCP, 53);
    let (allowed, decider, trail) = side(&specs, &client, Direction::Egress, None, &q);
    assert_eq!((allowed, decider), (true, Decider::Default));
    assert_eq!(trail, vec!["isolate rule 0 Pass"]);
    // Same priority: the name breaks the tie ("a-…" before "isolate").
    let mut tied = specs.to_vec();
    tied.push((
        "a-accept",
        admin(10, all_ns, json!([{"action": "Accept", "to": to_b}])),
    ));
    let q = query(server.end(), Protocol::TCP, 80);
    let (allowed, _, trail) = side(&tied, &client, Direction::Egress, None, &q);
    assert!(allowed);
    assert_eq!(trail, vec!["a-accept rule 0 Accept"]);
}

#[test]
fn subjects_and_peers_select_pods_and_networks() {
    let a_web = pod("tenant-a", "web", "10.0.0.5");
    let b_db = pod("tenant-b", "db", "10.0.1.5");
    let outside: IpAddr = "192.0.2.10".parse().unwrap();
    let deny = |subject: Value, to: Value| {
        [(
            "p",
            admin(1, subject, json!([{"action": "Deny", "to": to}])),
        )]
    };
    // (subject, to, source pod, destination, denied)
    let cases: Vec<(Value, Value, &Pod, End, bool)> = vec![
        (
            json!({"namespaces": {}}),
            json!([{"namespaces": {}}]),
            &a_web,
            b_db.end(),
            true,
        ),
        // The subject selects namespaces…
        (
            json!({"namespaces": {"matchLabels": {"tenant": "b"}}}),
            json!([{"namespaces": {}}]),
            &a_web,
            b_db.end(),
            false,
        ),
        // …or pods within namespaces.
        (
            json!({"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "web"}}}}),
            json!([{"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "db"}}}}]),
            &a_web,
            b_db.end(),
            true,
        ),
        (
            json!({"namespaces": {}}),
            json!([{"pods": {"namespaceSelector": {"matchLabels": {"tenant": "a"}}, "podSelector": {}}}]),
            &a_web,
            b_db.end(),
            false,
        ),
        // Networks match outside addresses and pods' addresses alike.
        (
            json!({"namespaces": {}}),
            json!([{"networks": ["192.0.2.0/24"]}]),
            &a_web,
            End::Address(outside),
            true,
        ),
        (
            json!({"namespaces": {}}),
            json!([{"networks": ["10.0.1.0/24"]}]),
            &a_web,
            b_db.end(),
            true,
        ),
        (
            json!({"namespaces": {}}),
            json!([{"networks": ["10.0.9.0/24"]}]),
            &a_web,
            b_db.end(),
            false,
        ),
        // Selectors never match a bare address.
        (
            json!({"namespaces": {}}),
            json!([{"namespaces": {}}]),
            &a_web,
            End::Address(outside),
            false,
        ),
    ];
    for (i, (subject, to, source, destination, denied)) in cases.into_iter().enumerate() {
        let specs = deny(subject, to);
        let q = query(destination, Protocol::TCP, 80);
        let (allowed, _, _) = side(&specs, source, Direction::Egress, None, &q);
        assert_eq!(!allowed, denied, "case {i}");
    }
}

#[test]
fn protocols_match_numbers_ranges_and_named_ports_of_any_protocol() {
    let client = pod("tenant-a", "client", "10.0.0.1");
    let server = pod("tenant-b", "server", "10.0.1.1");
    let deny_on = |protocols: Value| {
        [(
            "p",
            admin(
                1,
                json!({"namespaces": {}}),
                json!([{"action": "Deny", "to": [{"namespaces": {}}], "protocols": protocols}]),
            ),
        )]
    };
    // (protocols, flow protocol, port, denied)
    let cases = [
        (
            json!([{"tcp": {"destinationPort": {"number": 80}}}]),
            Protocol::TCP,
            80,
            true,
        ),
        (
            json!([{"tcp": {"destinationPort": {"number": 80}}}]),
            Protocol::UDP,
            80,
            false,
        ),
        (
            json!([{"udp": {"destinationPort": {"range": {"start": 5000, "end": 6000}}}}]),
            Protocol::UDP,
            6000,
            true,
        ),
        (
            json!([{"udp": {"destinationPort": {"range": {"start": 5000, "end": 6000}}}}]),
            Protocol::UDP,
            6001,
            false,
        ),
        (
            json!([{"destinationNamedPort": "http"}]),
            Protocol::TCP,
            8080,
            true,
        ),
        (
            json!([{"destinationNamedPort": "dns"}]),
            Protocol::UDP,
            5353,
            true,
        ),
        (
            json!([{"destinationNamedPort": "dns"}]),
            Protocol::TCP,
            5353,
            false,
        ),
        (
            json!([{"sctp": {"destinationPort": {"number": 9}}}, {"tcp": {"destinationPort": {"number": 443}}}]),
            Protocol::TCP,
            443,
            true,
        ),
    ];
    for (i, (protocols, protocol, port, denied)) in cases.into_iter().enumerate() {
        let specs = deny_on(protocols.clone());
        let q = query(server.end(), protocol, port);
        let (allowed, _, _) = side(&specs, &client, Direction::Egress, None, &q);
        assert_eq!(!allowed, denied, "case {i}: {protocols}");
    }
}

#[test]
fn what_cannot_be_read_fails_closed() {
    let client = pod("tenant-a", "client", "10.0.0.1");
    let server = pod("tenant-b", "server", "10.0.1.1");
    let rule = |action: &str, to: Value, protocols: Option<Value>| {
        let mut r = json!({"action": action, "to": to});
        if let Some(p) = protocols {
            r["protocols"] = p;
        }
        [("p", admin(1, json!({"namespaces": {}}), json!([r])))]
    };
    let unreadable = [
        json!([{}]),
        json!([{"namespaces": {}, "networks": ["10.0.0.0/8"]}]),
        json!([{"nodes": {}}]),
        json!([{"domainNames": ["example.com"]}]),
        json!([{"networks": ["10.0.0.0/33"]}]),
        json!([]),
    ];
    let q = query(server.end(), Protocol::TCP, 80);
    for to in unreadable {
        // Accept: the rule matches nothing; Deny and Pass: everything is denied.
        let (allowed, decider, _) = side(
            &rule("Accept", to.clone(), None),
            &client,
            Direction::Egress,
            Some(false),
            &q,
        );
        assert_eq!(
            (allowed, decider),
            (false, Decider::NetworkPolicy),
            "Accept {to}"
        );
        for action in ["Deny", "Pass"] {
            let (allowed, decider, _) = side(
                &rule(action, to.clone(), None),
                &client,
                Direction::Egress,
                Some(true),
                &q,
            );
            assert_eq!((allowed, decider), (false, Decider::Admin), "{action} {to}");
        }
    }
    let ns = json!([{"namespaces": {}}]);
    for protocols in [
        json!([]),
        json!([{}]),
        json!([{"tcp": {}}]),
        json!([{"tcp": {"destinationPort": {"range": {"start": 90, "end": 80}}}}]),
        json!([{"tcp": {"destinationPort": {"number": 0}}}]),
        json!([{"tcp": {"destinationPort": {"number": 80}}, "udp": {"destinationPort": {"number": 80}}}]),
    ] {
        let (allowed, _, _) = side(
            &rule("Pass", ns.clone(), Some(protocols.clone())),
            &client,
            Direction::Egress,
            None,
            &q,
        );
        assert!(!allowed, "Pass with {protocols}");
    }
    let (allowed, _, _) = side(
        &rule("Drop", ns, None),
        &client,
        Direction::Egress,
        None,
        &q,
    );
    assert!(!allowed, "an unknown action denies");
    // Ingress peers are namespaces and pods only.
    let s = spec(
        json!({"tier": "Baseline", "priority": 1, "subject": {"namespaces": {}},
        "ingress": [{"action": "Deny", "from": [{"networks": ["0.0.0.0/0"]}]}]}),
    );
    let p = ClusterPolicy::parse("p", &s).unwrap();
    assert_eq!(
        p.rules(Direction::Ingress)[0].invalid,
        Some(Invalid::PeerFields)
    );
}

#[test]
fn a_policy_without_a_tier_or_a_subject_applies_to_nothing() {
    for (value, why) in [
        (
            json!({"tier": "Platform", "subject": {"namespaces": {}}}),
            Invalid::Tier("Platform".into()),
        ),
        (json!({"tier": "Admin", "subject": {}}), Invalid::Subject),
        (
            json!({"tier": "Admin", "subject": {"namespaces": {}, "pods": {"podSelector": {}}}}),
            Invalid::Subject,
        ),
    ] {
        let s = spec(value.clone());
        assert_eq!(ClusterPolicy::parse("p", &s), Err(why), "{value}");
    }
    // A baseline policy is read the same way.
    let s = baseline(
        json!({"namespaces": {}}),
        json!([{"action": "Deny", "to": [{"namespaces": {}}]}]),
    );
    assert_eq!(ClusterPolicy::parse("p", &s).unwrap().tier, Tier::Baseline);
}
