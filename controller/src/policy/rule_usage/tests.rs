use super::*;
use network_enforcer_api::WorkloadNetworkPolicy;

const HOUR: i64 = 3600;
const DAY: i64 = 86_400;
const WEEK: Duration = Duration::from_secs(7 * 86_400);

fn t(secs: i64) -> Time {
    Time(Timestamp::from_second(secs).unwrap())
}

/// An ingress kubernetes policy whose rules allow `app=<peer>` on TCP `<port>`, one rule per pair.
fn spec(rules: &[(&str, u16)]) -> WorkloadNetworkPolicySpec {
    let ingress: Vec<serde_json::Value> = rules
        .iter()
        .map(|(peer, port)| {
            serde_json::json!({"from": [{"podSelector": {"matchLabels": {"app": peer}}}],
                               "ports": [{"protocol": "TCP", "port": port}]})
        })
        .collect();
    let policy: WorkloadNetworkPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
        "kind": "WorkloadNetworkPolicy",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"backend": "kubernetes", "direction": "Ingress", "mode": "monitor",
                 "targetRef": {"kind": "Deployment", "name": "web"},
                 "kubernetes": {"podSelector": {"matchLabels": {"app": "web"}},
                                "policyTypes": ["Ingress"], "ingress": ingress}}
    }))
    .unwrap();
    policy.spec
}

fn istio_spec(ports: &[&str]) -> WorkloadNetworkPolicySpec {
    let rules: Vec<serde_json::Value> = ports
        .iter()
        .map(|p| serde_json::json!({"to": [{"operation": {"ports": [p]}}]}))
        .collect();
    let policy: WorkloadNetworkPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
        "kind": "WorkloadNetworkPolicy",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"backend": "istio", "direction": "Ingress",
                 "targetRef": {"kind": "Deployment", "name": "web"},
                 "istio": {"selector": {"matchLabels": {"app": "web"}}, "rules": rules}}
    }))
    .unwrap();
    policy.spec
}

fn entry(rule: &RuleRef, last: Option<i64>, peers: i64, since: i64) -> RuleUsage {
    RuleUsage {
        direction: rule.direction,
        list: rule.list,
        rule: rule.index as i32,
        fingerprint: rule.fingerprint.clone(),
        last_matched: last.map(t),
        peers,
        since: t(since),
    }
}

#[test]
fn fingerprints_follow_the_rule_not_its_position() {
    let a = rules_of(&spec(&[("api", 80), ("db", 5432)]));
    let b = rules_of(&spec(&[("db", 5432), ("api", 80)]));
    assert_eq!(a.len(), 2);
    assert_eq!(a[0].fingerprint, b[1].fingerprint);
    assert_eq!(a[1].fingerprint, b[0].fingerprint);
    assert_ne!(a[0].fingerprint, a[1].fingerprint);
    assert_eq!(a[0].fingerprint.len(), 12);
    // An edit is a different rule.
    let edited = rules_of(&spec(&[("api", 81)]));
    assert_ne!(edited[0].fingerprint, a[0].fingerprint);
    assert_eq!((a[1].direction, a[1].index), (Direction::Ingress, 1));
    assert_eq!(a[1].name(), "ingress[1]");
    // Istio rules are Ingress rules of the istio payload.
    let istio = rules_of(&istio_spec(&["80", "443"]));
    assert_eq!(istio.len(), 2);
    assert_eq!(istio[1].name(), "ingress[1]");
}

/// An egress policy with `spec.egressNames` entries: the direction's rules, then the names.
fn named_egress_spec() -> WorkloadNetworkPolicySpec {
    let policy: WorkloadNetworkPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
        "kind": "WorkloadNetworkPolicy",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"backend": "kubernetes", "direction": "Egress", "mode": "monitor",
                 "targetRef": {"kind": "Deployment", "name": "web"},
                 "kubernetes": {"podSelector": {"matchLabels": {"app": "web"}},
                                "policyTypes": ["Egress"],
                                "egress": [{"ports": [{"protocol": "UDP", "port": 53}]}]},
                 "egressNames": [
                     {"names": ["api.partner.test"], "ports": [{"protocol": "TCP", "port": 443}]},
                     {"names": ["*.storage.partner.test"], "ports": [{"protocol": "TCP", "port": 443}]}
                 ]}
    }))
    .unwrap();
    policy.spec
}

#[test]
fn egress_names_entries_are_rules_of_their_own_list() {
    let spec = named_egress_spec();
    let rules = rules_of(&spec);
    let names: Vec<String> = rules.iter().map(RuleRef::name).collect();
    assert_eq!(names, ["egress[0]", "egressNames[0]", "egressNames[1]"]);
    assert_eq!(rules[1].list, Some(RuleList::EgressNames));
    assert_eq!(rules[1].index, 0);
    // A used name entry keeps its usage; the unused one is named in the condition.
    let now = 10 * DAY;
    let mut tracker = UsageTracker::<()>::default();
    tracker.record(&(), &rules[0], "10.0.0.10", (now - HOUR) * 1000);
    tracker.record(&(), &rules[1], "203.0.113.7", (now - HOUR) * 1000);
    let watched = merge(&[], &rules, None, &t(now - 8 * DAY));
    let usage = merge(&watched, &rules, tracker.of(&()), &t(now));
    assert_eq!(usage[1].list, Some(RuleList::EgressNames));
    assert_eq!((usage[1].rule, usage[1].peers), (0, 1));
    assert_eq!(usage[2].list, Some(RuleList::EgressNames));
    assert_eq!((usage[2].rule, usage[2].peers), (1, 0));
    let (desired, _) = unused_rules(&spec, &usage, None, Some(1), &t(now), WEEK);
    assert!(
        desired.message.contains("1 of 3 rules")
            && desired.message.contains("egressNames[1] (never matched)"),
        "{}",
        desired.message
    );
    // The entry as the status stores it: `list: egressNames`.
    let stored = serde_json::to_value(&usage[1]).unwrap();
    assert_eq!(stored["list"], "egressNames");
    assert!(
        serde_json::to_value(&usage[0])
            .unwrap()
            .get("list")
            .is_none()
    );
    // A name entry's usage is never taken for a rule of the direction's list with the same content.
    let mut as_own = usage[1].clone();
    as_own.list = None;
    assert!(rules[1].entry_in(&[as_own]).is_none());
}

#[test]
fn the_tracker_bounds_peers_and_forgets_deleted_policies() {
    let rule = &rules_of(&spec(&[("api", 80)]))[0];
    let mut tracker = UsageTracker::<&str>::default();
    for i in 0..(MAX_PEERS + 50) {
        tracker.record(&"shop/web", rule, &format!("peer-{i}"), i as i64);
    }
    // The same peer again is not counted twice.
    tracker.record(&"shop/web", rule, "peer-0", 5);
    let seen = &tracker.of(&"shop/web").unwrap()[&rule.key()];
    assert_eq!(seen.peers(), MAX_PEERS);
    assert_eq!(
        seen.last_ms,
        (MAX_PEERS + 49) as i64,
        "the newest match wins"
    );
    tracker.record(&"shop/other", rule, "x", 1);
    assert_eq!(tracker.len(), 2);
    assert_eq!(tracker.retain_policies(|k| *k == "shop/web"), 1);
    assert!(tracker.of(&"shop/other").is_none());
}

#[test]
fn merge_table() {
    let rules = rules_of(&spec(&[("api", 80), ("db", 5432)]));
    let (r0, r1) = (&rules[0], &rules[1]);
    let now = 10 * DAY;
    let granularity = LAST_MATCHED_GRANULARITY.as_secs() as i64;
    let seen = |entries: &[(&RuleRef, i64, &[&str])]| {
        let mut tracker = UsageTracker::<()>::default();
        for (rule, at, peers) in entries {
            for peer in *peers {
                tracker.record(&(), rule, peer, at * 1000);
            }
        }
        tracker
    };
    struct Case {
        name: &'static str,
        current: Vec<RuleUsage>,
        seen: UsageTracker<()>,
        /// (lastMatched, peers, since) per rule.
        want: Vec<(Option<i64>, i64, i64)>,
    }
    let cases = [
        Case {
            name: "new rules start now, never matched",
            current: vec![],
            seen: seen(&[]),
            want: vec![(None, 0, now), (None, 0, now)],
        },
        Case {
            name: "a match is recorded with its time and peers",
            current: vec![],
            seen: seen(&[(r1, now - 30, &["a", "b", "a"])]),
            want: vec![(None, 0, now), (Some(now - 30), 2, now)],
        },
        Case {
            name: "what the status holds survives a restart (max of both)",
            current: vec![entry(r0, Some(now - HOUR), 7, 0), entry(r1, None, 0, 0)],
            seen: seen(&[(r0, now - 2 * HOUR, &["a"])]),
            want: vec![(Some(now - HOUR), 7, 0), (None, 0, 0)],
        },
        Case {
            name: "a newer match within the granularity does not move lastMatched",
            current: vec![entry(r0, Some(now - 60), 1, 0)],
            seen: seen(&[(r0, now - 60 + granularity - 1, &["a"])]),
            want: vec![(Some(now - 60), 1, 0), (None, 0, now)],
        },
        Case {
            name: "one granularity later it does",
            current: vec![entry(r0, Some(now - 2 * granularity), 1, 0)],
            seen: seen(&[(r0, now - granularity, &["a", "b"])]),
            want: vec![(Some(now - granularity), 2, 0), (None, 0, now)],
        },
        Case {
            name: "a match in the future (agent clock) is taken as now",
            current: vec![],
            seen: seen(&[(r0, now + DAY, &["a"])]),
            want: vec![(Some(now), 1, now), (None, 0, now)],
        },
        Case {
            name: "usage follows reordered rules; entries of removed rules are dropped",
            current: vec![
                RuleUsage {
                    rule: 0,
                    ..entry(r1, Some(now - DAY), 3, 0)
                },
                RuleUsage {
                    fingerprint: "000000000000".into(),
                    ..entry(r0, Some(now), 9, 0)
                },
            ],
            seen: seen(&[]),
            want: vec![(None, 0, now), (Some(now - DAY), 3, 0)],
        },
        Case {
            name: "stored peers above the cap are cut to it",
            current: vec![entry(r0, Some(now), 5000, 0)],
            seen: seen(&[(r0, now, &["a"])]),
            want: vec![(Some(now), MAX_PEERS as i64, 0), (None, 0, now)],
        },
    ];
    for case in cases {
        let merged = merge(&case.current, &rules, case.seen.of(&()), &t(now));
        let got: Vec<(Option<i64>, i64, i64)> = merged
            .iter()
            .map(|u| {
                (
                    u.last_matched.as_ref().map(|t| t.0.as_second()),
                    u.peers,
                    u.since.0.as_second(),
                )
            })
            .collect();
        assert_eq!(got, case.want, "{}", case.name);
        for (i, (u, rule)) in merged.iter().zip(&rules).enumerate() {
            assert_eq!(u.rule, i as i32, "{}", case.name);
            assert_eq!(u.fingerprint, rule.fingerprint, "{}", case.name);
        }
    }
}

#[test]
fn unused_rules_table() {
    let rules = rules_of(&spec(&[("api", 80), ("db", 5432), ("cache", 6379)]));
    let s = spec(&[("api", 80), ("db", 5432), ("cache", 6379)]);
    let now = 30 * DAY;
    struct Case {
        name: &'static str,
        usage: Vec<RuleUsage>,
        created: i64,
        generation: i64,
        /// (status, reason, names in the message, recheck in seconds)
        want: (bool, &'static str, Vec<&'static str>, Option<i64>),
    }
    let cases = vec![
        Case {
            name: "a new policy: nothing unused yet, look again when the week is over",
            usage: vec![],
            created: now - DAY,
            generation: 1,
            want: (false, "RulesUsed", vec![], Some(6 * DAY)),
        },
        Case {
            name: "never matched since promotion a week ago: all three are unused",
            usage: vec![],
            created: now - 7 * DAY,
            generation: 1,
            want: (
                true,
                "RulesUnused",
                vec![
                    "ingress[0] (never matched)",
                    "ingress[1] (never matched)",
                    "ingress[2] (never matched)",
                ],
                None,
            ),
        },
        Case {
            name: "matched rules count from their last match, others from since",
            usage: vec![
                entry(&rules[0], Some(now - HOUR), 2, now - 20 * DAY),
                entry(&rules[1], Some(now - 8 * DAY), 1, now - 20 * DAY),
                entry(&rules[2], None, 0, now - 2 * DAY),
            ],
            created: now - 20 * DAY,
            generation: 3,
            want: (
                true,
                "RulesUnused",
                vec!["ingress[1] (last matched"],
                Some(5 * DAY),
            ),
        },
        Case {
            name: "an edited policy's rule without an entry is not judged yet",
            usage: vec![
                entry(&rules[0], Some(now - HOUR), 2, now - 20 * DAY),
                entry(&rules[1], Some(now - HOUR), 2, now - 20 * DAY),
            ],
            created: now - 20 * DAY,
            generation: 2,
            want: (false, "RulesUsed", vec![], Some(7 * DAY - HOUR)),
        },
        Case {
            name: "the same rule never edited counts from creation",
            usage: vec![
                entry(&rules[0], Some(now - HOUR), 2, now - 20 * DAY),
                entry(&rules[1], Some(now - HOUR), 2, now - 20 * DAY),
            ],
            created: now - 20 * DAY,
            generation: 1,
            want: (
                true,
                "RulesUnused",
                vec!["ingress[2] (never matched)"],
                Some(7 * DAY - HOUR),
            ),
        },
        Case {
            name: "usage of another rule (other fingerprint) does not count",
            usage: vec![RuleUsage {
                fingerprint: "ffffffffffff".into(),
                ..entry(&rules[0], Some(now), 2, 0)
            }],
            created: now - 8 * DAY,
            generation: 1,
            want: (
                true,
                "RulesUnused",
                vec![
                    "ingress[0] (never matched)",
                    "ingress[1] (never matched)",
                    "ingress[2] (never matched)",
                ],
                None,
            ),
        },
        Case {
            name: "exactly at the threshold is unused",
            usage: vec![
                entry(&rules[0], Some(now - 7 * DAY), 1, 0),
                entry(&rules[1], Some(now), 1, 0),
                entry(&rules[2], Some(now), 1, 0),
            ],
            created: 0,
            generation: 1,
            want: (true, "RulesUnused", vec!["ingress[0]"], Some(7 * DAY)),
        },
    ];
    for case in cases {
        let (desired, recheck) = unused_rules(
            &s,
            &case.usage,
            Some(&t(case.created)),
            Some(case.generation),
            &t(now),
            WEEK,
        );
        let (status, reason, names, wait) = &case.want;
        assert_eq!(desired.type_, UNUSED_RULES, "{}", case.name);
        assert_eq!(
            desired.status, *status,
            "{}: {}",
            case.name, desired.message
        );
        assert_eq!(desired.reason, *reason, "{}", case.name);
        for name in names {
            assert!(
                desired.message.contains(name),
                "{}: {name:?} not in {:?}",
                case.name,
                desired.message
            );
        }
        if *status {
            assert!(
                desired
                    .message
                    .starts_with(&format!("{} of 3 rules", names.len())),
                "{}: {}",
                case.name,
                desired.message
            );
            assert!(desired.message.contains("within 7d"), "{}", desired.message);
        }
        assert_eq!(recheck.map(|d| d.as_secs() as i64), *wait, "{}", case.name);
    }
    // No rules at all: nothing can be unused.
    let (desired, recheck) = unused_rules(&spec(&[]), &[], Some(&t(0)), Some(1), &t(now), WEEK);
    assert_eq!(
        (desired.status, desired.reason.as_str()),
        (false, "NoRules")
    );
    assert_eq!(recheck, None);
}

#[test]
fn the_message_names_at_most_twenty_rules() {
    let pairs: Vec<(String, u16)> = (0..25).map(|i| (format!("p{i}"), 80)).collect();
    let pairs: Vec<(&str, u16)> = pairs.iter().map(|(p, n)| (p.as_str(), *n)).collect();
    let (desired, _) = unused_rules(&spec(&pairs), &[], Some(&t(0)), Some(1), &t(30 * DAY), WEEK);
    assert!(
        desired.message.starts_with("25 of 25 rules"),
        "{}",
        desired.message
    );
    assert!(desired.message.contains("ingress[19]"));
    assert!(!desired.message.contains("ingress[20]"));
    assert!(
        desired.message.ends_with("and 5 more"),
        "{}",
        desired.message
    );
}

#[test]
fn usage_in_words() {
    let rules = rules_of(&spec(&[("api", 80), ("db", 5432), ("x", 1), ("y", 2)]));
    let now = 10 * DAY;
    let usage = vec![
        entry(&rules[0], Some(now - 2 * HOUR - 59), 3, 0),
        entry(&rules[1], None, 0, 0),
        entry(&rules[2], Some(now - 45), 1000, 0),
    ];
    let d = |i: usize| describe(&rules[i], &usage, &t(now));
    assert_eq!(d(0), "last matched 2h ago, 3 peers");
    assert_eq!(d(1), "never matched");
    assert_eq!(d(2), "last matched 45s ago, 1000+ peers");
    assert_eq!(d(3), "usage unknown");
    let one = vec![entry(&rules[0], Some(now - 3 * DAY), 1, 0)];
    assert_eq!(
        describe(&rules[0], &one, &t(now)),
        "last matched 3d ago, 1 peer"
    );
    assert_eq!(short_duration(WEEK), "7d");
    assert_eq!(short_duration(Duration::from_secs(36 * 3600)), "1d12h");
    assert_eq!(short_duration(Duration::from_secs(90)), "1m30s");
    assert_eq!(short_duration(Duration::from_millis(5)), "5ms");
}
