//! Learned wildcards (docs/behaviour.md §1.6): when a proposal has learned at least
//! [`Limits::wildcard_min_names`](super::Limits) distinct names directly under one parent on the same
//! port (`a.cdn.example`, `b.cdn.example`, … on TCP 443), they become one `*.cdn.example` entry on that
//! port. A workload that reaches many siblings is usually reaching a service that hands out
//! per-tenant, per-shard or per-region host names; the next one would break protect.
//!
//! Never for a public suffix (`*.co.uk`, `*.github.io`, `*.s3.amazonaws.com` would let the workload reach
//! anyone's names): the parent must be below a suffix of the Public Suffix List (the `psl` crate's
//! compiled copy), and have at least two labels (what the API accepts after `*.`). Pure.

use super::merge::covers;
use k8s_openapi::api::networking::v1::NetworkPolicyPort;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use network_enforcer_api::NameRule;
use network_enforcer_api::dns_name;
use std::collections::{BTreeMap, BTreeSet};

/// Default of [`Limits::wildcard_min_names`](super::Limits): sibling names seen on one port before
/// their parent is proposed as a wildcard.
pub const DEFAULT_WILDCARD_MIN_NAMES: usize = 5;

/// The parent a wildcard for `name` would cover (`b.example.com` → `example.com`), when one may be
/// proposed: `name` is an exact name, and its parent has two labels or more and is not a public
/// suffix.
pub fn wildcard_parent(name: &str) -> Option<&str> {
    if name.starts_with("*.") {
        return None;
    }
    let (_, parent) = name.split_once('.')?;
    if !parent.contains('.') {
        return None;
    }
    // A suffix the list does not know is its last label (the list's `*` rule): `example.test` is
    // below `test`, so it may be a parent.
    let suffix = psl::suffix(parent.as_bytes())?;
    (suffix.as_bytes() != parent.as_bytes()).then_some(parent)
}

/// Folds sibling names of `rules` into wildcards, per (protocol, port): each group of at least
/// `min_names` exact names with one parent ([`wildcard_parent`]) on one port gives that port to the
/// rule `*.<parent>` (added when missing) and takes it from the siblings' rules; a rule left without
/// ports goes. Only rules of one name are folded (what learning writes); rules a user wrote with
/// several names stay as written. `min_names` 0 folds nothing. Returns the wildcards given a port.
pub fn fold(rules: &mut Vec<NameRule>, min_names: usize) -> Vec<String> {
    if min_names == 0 {
        return Vec::new();
    }
    // (parent, protocol, port) → the rules (by index) holding it for a name under that parent.
    let mut groups: BTreeMap<(&str, String, i32), BTreeSet<usize>> = BTreeMap::new();
    for (i, rule) in rules.iter().enumerate() {
        let [name] = rule.names.as_slice() else {
            continue;
        };
        let Some(parent) = wildcard_parent(name) else {
            continue;
        };
        for port in &rule.ports {
            if let (Some(IntOrString::Int(n)), None) = (&port.port, port.end_port) {
                let protocol = port.protocol.clone().unwrap_or_else(|| "TCP".into());
                groups.entry((parent, protocol, *n)).or_default().insert(i);
            }
        }
    }
    let folds: Vec<(String, String, i32, BTreeSet<usize>)> = groups
        .into_iter()
        .filter(|(_, members)| members.len() >= min_names)
        .map(|((parent, protocol, port), members)| (format!("*.{parent}"), protocol, port, members))
        .collect();
    let mut folded = Vec::new();
    // Rules whose last port went to a wildcard (a rule without ports would allow every port).
    let mut emptied = BTreeSet::new();
    for (wildcard, protocol, port, members) in folds {
        for &i in &members {
            rules[i].ports.retain(|p| {
                !(p.port == Some(IntOrString::Int(port))
                    && p.end_port.is_none()
                    && p.protocol.as_deref().unwrap_or("TCP") == protocol)
            });
            if rules[i].ports.is_empty() {
                emptied.insert(i);
            }
        }
        let entry = NetworkPolicyPort {
            protocol: Some(protocol.clone()),
            port: Some(IntOrString::Int(port)),
            end_port: None,
        };
        match rules
            .iter_mut()
            .find(|r| matches!(r.names.as_slice(), [n] if *n == wildcard))
        {
            Some(rule) if covers(&rule.ports, &protocol, port) => {}
            Some(rule) => rule.ports.push(entry),
            None => rules.push(NameRule {
                names: vec![wildcard.clone()],
                ports: vec![entry],
            }),
        }
        folded.push(wildcard);
    }
    let mut i = 0;
    rules.retain(|_| {
        i += 1;
        !emptied.contains(&(i - 1))
    });
    folded.sort();
    folded.dedup();
    folded
}

/// Whether a wildcard rule of `rules` already allows `name` on `protocol`/`port`: a name under a learned
/// wildcard is not learned again on its own.
pub fn covered(rules: &[NameRule], name: &str, protocol: &str, port: i32) -> bool {
    rules.iter().any(|r| {
        r.names
            .iter()
            .any(|n| n.starts_with("*.") && dns_name::matches(n, name))
            && covers(&r.ports, protocol, port)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str, ports: &[(&str, i32)]) -> NameRule {
        NameRule {
            names: vec![name.to_string()],
            ports: ports
                .iter()
                .map(|(protocol, port)| NetworkPolicyPort {
                    protocol: Some(protocol.to_string()),
                    port: Some(IntOrString::Int(*port)),
                    end_port: None,
                })
                .collect(),
        }
    }

    /// `(names, ports)` of each rule, for comparing.
    fn shape(rules: &[NameRule]) -> Vec<(String, Vec<(String, i32)>)> {
        rules
            .iter()
            .map(|r| {
                (
                    r.names.join(","),
                    r.ports
                        .iter()
                        .filter_map(|p| match p.port {
                            Some(IntOrString::Int(n)) => Some((p.protocol.clone().unwrap(), n)),
                            _ => None,
                        })
                        .collect(),
                )
            })
            .collect()
    }

    #[test]
    fn a_parent_is_below_a_public_suffix_with_two_labels_or_more() {
        for (name, parent) in [
            ("a.example.com", Some("example.com")),
            ("a.b.example.com", Some("b.example.com")),
            ("a.api.example.test", Some("api.example.test")),
            // The parent would be a public suffix: ICANN's and the list's private section.
            ("a.example.co.uk", Some("example.co.uk")),
            ("example.co.uk", None),
            ("a.co.uk", None),
            ("bucket.s3.amazonaws.com", None),
            ("someone.github.io", None),
            // One label left, or nothing to fold.
            ("example.com", None),
            ("localhost", None),
            ("*.example.com", None),
        ] {
            assert_eq!(wildcard_parent(name), parent, "{name}");
        }
    }

    #[test]
    fn siblings_on_one_port_fold_into_a_wildcard_at_the_threshold_only() {
        let siblings = |n: usize| -> Vec<NameRule> {
            (0..n)
                .map(|i| rule(&format!("t{i}.cdn.example.com"), &[("TCP", 443)]))
                .collect()
        };
        let mut below = siblings(4);
        assert!(fold(&mut below, 5).is_empty());
        assert_eq!(below, siblings(4));

        let mut at = siblings(5);
        assert_eq!(fold(&mut at, 5), ["*.cdn.example.com"]);
        assert_eq!(
            shape(&at),
            [("*.cdn.example.com".into(), vec![("TCP".into(), 443)])]
        );

        // 0: never.
        let mut off = siblings(9);
        assert!(fold(&mut off, 0).is_empty());
        assert_eq!(off.len(), 9);
    }

    #[test]
    fn only_the_shared_port_folds_and_other_ports_stay_with_their_name() {
        let mut rules = vec![
            rule("a.example.com", &[("TCP", 443), ("TCP", 80)]),
            rule("b.example.com", &[("TCP", 443)]),
            rule("c.example.com", &[("TCP", 443), ("UDP", 443)]),
            rule("other.test", &[("TCP", 443)]),
        ];
        assert_eq!(fold(&mut rules, 3), ["*.example.com"]);
        assert_eq!(
            shape(&rules),
            [
                ("a.example.com".into(), vec![("TCP".into(), 80)]),
                ("c.example.com".into(), vec![("UDP".into(), 443)]),
                ("other.test".into(), vec![("TCP".into(), 443)]),
                ("*.example.com".into(), vec![("TCP".into(), 443)]),
            ]
        );
    }

    #[test]
    fn public_suffixes_and_rules_of_several_names_never_fold() {
        let mut rules: Vec<NameRule> = (0..6)
            .map(|i| rule(&format!("user{i}.github.io"), &[("TCP", 443)]))
            .chain((0..6).map(|i| rule(&format!("shop{i}.co.uk"), &[("TCP", 443)])))
            .collect();
        let mut written = rule("a.example.com", &[("TCP", 443)]);
        written.names.push("b.example.com".into());
        rules.push(written);
        let before = rules.clone();
        assert!(fold(&mut rules, 2).is_empty());
        assert_eq!(rules, before);
    }

    #[test]
    fn an_existing_wildcard_gains_the_port_and_covers_later_names() {
        let mut rules = vec![
            rule("*.example.com", &[("TCP", 80)]),
            rule("a.example.com", &[("TCP", 443)]),
            rule("b.example.com", &[("TCP", 443)]),
        ];
        assert_eq!(fold(&mut rules, 2), ["*.example.com"]);
        assert_eq!(
            shape(&rules),
            [(
                "*.example.com".into(),
                vec![("TCP".into(), 80), ("TCP".into(), 443)]
            )]
        );
        assert!(covered(&rules, "new.example.com", "TCP", 443));
        assert!(covered(&rules, "deep.new.example.com", "TCP", 80));
        assert!(!covered(&rules, "new.example.com", "UDP", 443));
        assert!(!covered(&rules, "example.com", "TCP", 443));
        assert!(!covered(&rules, "a.other.test", "TCP", 443));
    }
}
