use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use network_enforcer_api::ViolationBucket;

fn time(seconds: i64) -> Time {
    Time(Timestamp::from_second(1_800_000_000 + seconds).unwrap())
}

fn workload(name: &str) -> WorkloadRef {
    WorkloadRef {
        namespace: "demo".into(),
        owner_kind: "Deployment".into(),
        owner_name: name.into(),
        ..WorkloadRef::default()
    }
}

/// A UDP violation client→server on `port`, seen at `at`.
fn observation(port: i32, at: i64) -> Observation {
    Observation {
        timestamp: time(at),
        source: workload("http-client"),
        dest: workload("http-server"),
        protocol: Protocol::UDP,
        dst_port: Some(port),
        action: PolicyMode::Monitor,
        direction: Direction::Egress,
        denying_policy_namespace: "demo".into(),
        denying_policy_name: "deployment-http-client-egress".into(),
    }
}

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn ack(id: &str) -> String {
    format!("networkenforcer.kubewarden.io/acknowledge-{id}")
}

/// One sync that clears nothing.
fn sync_with(
    status: Option<&WorkloadNetworkPolicyStatus>,
    observations: &[Observation],
    annotations: Option<&BTreeMap<String, String>>,
) -> SyncOutcome {
    sync(
        SyncInput {
            status,
            generation: Some(3),
            annotations,
            observations,
            now: &time(1000),
        },
        |_| false,
    )
}

#[test]
fn a_new_violation_gets_the_id_violation_count() {
    let out = sync_with(None, &[observation(18081, 0)], None);
    assert!(out.status_changed);
    let s = &out.status;
    assert_eq!((s.violation_count, s.active_violation_count), (1, 1));
    assert_eq!(s.observed_generation, Some(3));
    let r = &s.violations[0];
    assert_eq!(r.id, 0);
    assert_eq!(r.direction, Some(Direction::Egress));
    assert_eq!(r.dst_port, Some(18081));
    let out = sync_with(Some(s), &[observation(53, 5)], None);
    assert_eq!(out.status.violations[0].id, 1, "newest first");
    assert_eq!(out.status.violations[1].id, 0);
}

#[test]
fn re_observations_count_but_only_refresh_the_timestamp() {
    let first = sync_with(None, &[observation(18081, 10)], None).status;
    let out = sync_with(
        Some(&first),
        &[observation(18081, 100), observation(18081, 200)],
        None,
    );
    let s = &out.status;
    assert_eq!(s.violation_count, 3, "each a window apart: each counts");
    assert_eq!(s.violations.len(), 1);
    assert_eq!(s.violations[0].id, 0);
    assert_eq!(s.violations[0].timestamp, time(200));
    let out = sync_with(Some(&out.status), &[observation(18081, 30)], None);
    assert_eq!(
        out.status.violations[0].timestamp,
        time(200),
        "an older re-observation does not move the timestamp back"
    );
    assert_eq!(out.status.violation_count, 4, "more than a window older");
}

/// An occurrence the status counted already (within the repeat window of its record's timestamp)
/// counts nothing: a batch resent to a new leader, whose in-memory repeat filter is empty, brings the
/// same occurrence again (docs/behaviour.md §3.6). Also for an acknowledged record, which stays
/// acknowledged.
#[test]
fn an_occurrence_already_counted_counts_nothing_when_it_comes_again() {
    let first = sync_with(None, &[observation(18081, 10)], None).status;
    let again = sync_with(
        Some(&first),
        &[
            observation(18081, 10),
            observation(18081, 0),
            observation(18081, 69),
        ],
        None,
    );
    assert_eq!(again.status, first, "counted already");
    assert!(!again.status_changed);

    let acknowledged =
        sync_with(Some(&first), &[], Some(&annotations(&[(&ack("0"), "ok")]))).status;
    assert_eq!(acknowledged.acknowledged_violations.len(), 1);
    let resent = sync_with(Some(&acknowledged), &[observation(18081, 10)], None).status;
    assert_eq!(resent.violation_count, 1);
    assert!(resent.violations.is_empty(), "{resent:?}");
    let later = sync_with(Some(&acknowledged), &[observation(18081, 70)], None).status;
    assert_eq!(later.violation_count, 2, "a window later it counts");
    assert_eq!(later.violations.len(), 1, "and is active again");
}

#[test]
fn the_hourly_history_counts_what_violation_count_counts() {
    let with = |h: i64, count: i64| ViolationBucket {
        start: time(h * 3600),
        count,
    };
    let first = sync_with(
        None,
        &[observation(18081, 10), observation(53, -3590)],
        None,
    )
    .status;
    assert_eq!(first.violation_history, vec![with(-1, 1), with(0, 1)]);
    // A resend of a counted occurrence adds to neither; a repeat a window later adds to both; an
    // occurrence older than the kept hours only to the count.
    let out = sync_with(
        Some(&first),
        &[
            observation(18081, 10),
            observation(18081, 80),
            observation(5353, -48 * 3600),
        ],
        None,
    )
    .status;
    assert_eq!(out.violation_count, 4);
    assert_eq!(out.violation_history, vec![with(-1, 1), with(0, 2)]);
    // Hours age out of the next status written; ageing alone writes nothing.
    let later = |observations: &[Observation]| {
        sync(
            SyncInput {
                status: Some(&out),
                generation: Some(3),
                annotations: None,
                observations,
                now: &time(47 * 3600),
            },
            |_| false,
        )
    };
    let aged = later(&[]);
    assert!(!aged.status_changed);
    assert_eq!(aged.status.violation_history, vec![with(0, 2)]);
    let written = later(&[observation(53, 47 * 3600)]);
    assert!(written.status_changed);
    assert_eq!(
        written.status.violation_history,
        vec![with(0, 2), with(47, 1)]
    );
}

#[test]
fn every_field_of_the_dedupe_key_separates_records() {
    let base = observation(18081, 0);
    let variants: Vec<Observation> = vec![
        Observation {
            direction: Direction::Ingress,
            ..base.clone()
        },
        Observation {
            action: PolicyMode::Protect,
            ..base.clone()
        },
        Observation {
            protocol: Protocol::TCP,
            ..base.clone()
        },
        Observation {
            dst_port: None,
            ..base.clone()
        },
        Observation {
            denying_policy_name: "other".into(),
            ..base.clone()
        },
        Observation {
            denying_policy_namespace: "other".into(),
            ..base.clone()
        },
        Observation {
            source: WorkloadRef {
                identity: "cluster.local/ns/demo/sa/x".into(),
                ..base.source.clone()
            },
            ..base.clone()
        },
        Observation {
            source: WorkloadRef {
                owner_kind: "StatefulSet".into(),
                ..base.source.clone()
            },
            ..base.clone()
        },
        Observation {
            dest: WorkloadRef {
                namespace: "other".into(),
                ..base.dest.clone()
            },
            ..base.clone()
        },
        Observation {
            dest: WorkloadRef {
                owner_name: "other".into(),
                ..base.dest.clone()
            },
            ..base.clone()
        },
        // Two hosts outside the cluster are two records.
        Observation {
            dest: WorkloadRef {
                address: "8.8.8.8".into(),
                ..WorkloadRef::default()
            },
            ..base.clone()
        },
        Observation {
            dest: WorkloadRef {
                address: "1.1.1.1".into(),
                ..WorkloadRef::default()
            },
            ..base.clone()
        },
        // The same address reached by a name is another record than the literal, and by another
        // name another again: the policy allows each by its own name (`spec.egressNames`).
        Observation {
            dest: WorkloadRef {
                address: "1.1.1.1".into(),
                dns_name: "one.one.one.one".into(),
                ..WorkloadRef::default()
            },
            ..base.clone()
        },
        Observation {
            dest: WorkloadRef {
                address: "1.1.1.1".into(),
                dns_name: "cloudflare-dns.com".into(),
                ..WorkloadRef::default()
            },
            ..base.clone()
        },
    ];
    let mut all = vec![base];
    all.extend(variants);
    let out = sync_with(None, &all, None);
    assert_eq!(out.status.violations.len(), all.len());
    // The selector is not part of the key: the same workload seen with another selector string.
    let mut same = all[0].clone();
    same.source.selector = "app=http-client".into();
    let again = sync_with(Some(&out.status), &[same], None);
    assert_eq!(again.status.violations.len(), all.len());
}

#[test]
fn at_most_100_records_newest_first() {
    let observations: Vec<_> = (0..105).map(|i| observation(i, i64::from(i))).collect();
    let out = sync_with(None, &observations, None);
    let s = &out.status;
    assert_eq!(s.violation_count, 105);
    assert_eq!(s.active_violation_count, 100);
    let ids: Vec<i64> = s.violations.iter().map(|r| r.id).collect();
    assert_eq!(ids, (5..105).rev().collect::<Vec<_>>());
    // Equal timestamps: the later id first.
    let tied = sync_with(None, &[observation(1, 0), observation(2, 0)], None);
    assert_eq!(
        tied.status
            .violations
            .iter()
            .map(|r| r.id)
            .collect::<Vec<_>>(),
        [1, 0]
    );
}

#[test]
fn records_the_spec_now_allows_are_cleared_after_merging() {
    let first = sync_with(None, &[observation(18081, 0), observation(53, 1)], None).status;
    let out = sync(
        SyncInput {
            status: Some(&first),
            generation: Some(4),
            annotations: None,
            // A window after the first 18081: a new occurrence.
            observations: &[observation(18081, 100), observation(9999, 101)],
            now: &time(110),
        },
        |r| r.dst_port != Some(53),
    );
    let s = &out.status;
    assert_eq!(s.violation_count, 4, "cleared observations still count");
    assert_eq!(
        s.violations.iter().map(|r| r.id).collect::<Vec<_>>(),
        [1],
        "18081 and the new 9999 are allowed now"
    );
    assert_eq!(s.active_violation_count, 1);
    // 9999 got id 3: the re-observed 18081 had taken count 2.
    assert_eq!(out.cleared.iter().map(|r| r.id).collect::<Vec<_>>(), [3, 0]);
    assert_eq!(s.observed_generation, Some(4));
}

#[test]
fn acknowledging_moves_the_record_and_consumes_the_annotation() {
    let first = sync_with(None, &[observation(18081, 0), observation(53, 1)], None).status;
    let notes = annotations(&[
        (&ack("0"), "expected during the migration"),
        ("unrelated/annotation", "x"),
    ]);
    let out = sync_with(Some(&first), &[], Some(&notes));
    assert!(out.status_changed);
    assert_eq!(out.remove_annotations, [ack("0")]);
    assert!(out.unknown.is_empty());
    assert_eq!(out.acknowledged.len(), 1);
    let s = &out.status;
    assert_eq!(s.violations.iter().map(|r| r.id).collect::<Vec<_>>(), [1]);
    assert_eq!(s.active_violation_count, 1);
    assert_eq!(
        s.violation_count, 2,
        "acknowledging does not change the count"
    );
    let a = &s.acknowledged_violations[0];
    assert_eq!(a.violation.id, 0);
    assert_eq!(a.reason, "expected during the migration");
    assert_eq!(a.acknowledged_at, time(1000));
    assert_eq!(out.acknowledged[0], *a);
}

#[test]
fn unknown_and_malformed_ids_are_reported_and_removed() {
    let first = sync_with(None, &[observation(18081, 0)], None).status;
    let notes = annotations(&[(&ack("7"), "r"), (&ack("x1"), "r")]);
    let out = sync_with(Some(&first), &[], Some(&notes));
    assert_eq!(out.remove_annotations, [ack("7"), ack("x1")]);
    assert_eq!(
        out.unknown,
        [
            UnknownAcknowledgement {
                annotation: ack("7"),
                problem: UnknownId::NotFound(7)
            },
            UnknownAcknowledgement {
                annotation: ack("x1"),
                problem: UnknownId::NotANumber("x1".into())
            },
        ]
    );
    assert_eq!(
        out.unknown[0].problem.to_string(),
        "violation 7 is not an active violation of this policy"
    );
    assert!(
        !out.status_changed,
        "nothing to patch in the status, only annotations to remove"
    );
    assert_eq!(out.status, first);
}

#[test]
fn an_annotation_left_over_after_its_acknowledgement_is_removed_quietly() {
    let first = sync_with(None, &[observation(18081, 0)], None).status;
    let notes = annotations(&[(&ack("0"), "ok")]);
    let acknowledged = sync_with(Some(&first), &[], Some(&notes)).status;
    // The annotation removal failed; the next sync sees it again.
    let out = sync_with(Some(&acknowledged), &[], Some(&notes));
    assert_eq!(out.remove_annotations, [ack("0")]);
    assert!(out.unknown.is_empty());
    assert!(out.acknowledged.is_empty());
    assert!(!out.status_changed);
    assert_eq!(out.status.acknowledged_violations.len(), 1);
}

#[test]
fn acknowledged_records_are_newest_first_and_capped_at_100() {
    let observations: Vec<_> = (0..100).map(|i| observation(i, i64::from(i))).collect();
    let mut status = sync_with(None, &observations, None).status;
    // Acknowledge 60 records at t=1000, then 60 more... of the 100, at t=2000 (only 40 remain).
    let first: Vec<(String, &str)> = (0..60).map(|i| (ack(&i.to_string()), "a")).collect();
    let notes: BTreeMap<String, String> = first
        .iter()
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect();
    status = sync_with(Some(&status), &[], Some(&notes)).status;
    let second: BTreeMap<String, String> = (60..100)
        .map(|i| (ack(&i.to_string()), "b".to_string()))
        .collect();
    let out = sync(
        SyncInput {
            status: Some(&status),
            generation: Some(3),
            annotations: Some(&second),
            observations: &[],
            now: &time(2000),
        },
        |_| false,
    );
    let s = &out.status;
    assert!(s.violations.is_empty());
    assert_eq!(s.acknowledged_violations.len(), MAX_ACKNOWLEDGED);
    let ids: Vec<i64> = s
        .acknowledged_violations
        .iter()
        .map(|a| a.violation.id)
        .collect();
    // Newest acknowledgements first (ids 99..60 at t=2000), then 59..0 of t=1000 (the cap keeps
    // 100 of the 100).
    assert_eq!(ids[..40], (60..100).rev().collect::<Vec<_>>()[..]);
    assert_eq!(ids[40..], (0..60).rev().collect::<Vec<_>>()[..]);
    // One more acknowledgement drops the oldest acknowledged record.
    let more = sync_with(Some(s), &[observation(5000, 3000)], None).status;
    let notes = annotations(&[(&ack("100"), "c")]);
    let out = sync(
        SyncInput {
            status: Some(&more),
            generation: Some(3),
            annotations: Some(&notes),
            observations: &[],
            now: &time(3000),
        },
        |_| false,
    );
    let acknowledged = &out.status.acknowledged_violations;
    assert_eq!(acknowledged.len(), MAX_ACKNOWLEDGED);
    assert_eq!(acknowledged[0].violation.id, 100);
    assert_eq!(acknowledged.last().unwrap().violation.id, 1, "id 0 dropped");
}

#[test]
fn several_acknowledgements_in_one_sync_list_the_newest_record_first() {
    let observations: Vec<_> = (0..11).map(|i| observation(i, i64::from(i))).collect();
    let status = sync_with(None, &observations, None).status;
    let notes = annotations(&[(&ack("10"), "x"), (&ack("9"), "y")]);
    let out = sync_with(Some(&status), &[], Some(&notes));
    let ids: Vec<i64> = out.acknowledged.iter().map(|a| a.violation.id).collect();
    assert_eq!(ids, [10, 9]);
    assert_eq!(out.status.acknowledged_violations[0].reason, "x");
}

#[test]
fn nothing_new_means_nothing_to_patch_and_conditions_survive() {
    let mut status = sync_with(None, &[observation(18081, 0)], None).status;
    status.conditions = vec![Condition {
        type_: "Ready".into(),
        status: "True".into(),
        reason: "Rendered".into(),
        message: String::new(),
        last_transition_time: time(0),
        observed_generation: Some(3),
    }];
    let out = sync_with(Some(&status), &[], None);
    assert!(!out.status_changed);
    assert!(out.remove_annotations.is_empty());
    assert_eq!(out.status, status);
    // A new generation alone is a change (observedGeneration moves).
    let out = sync(
        SyncInput {
            status: Some(&status),
            generation: Some(4),
            annotations: None,
            observations: &[],
            now: &time(0),
        },
        |_| false,
    );
    assert!(out.status_changed);
    assert_eq!(out.status.conditions, status.conditions);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// For any batches of observations: the count grows by exactly the number of observations
        /// not counted already (all times here lie within one repeat window: the first of each key
        /// counts), the hourly history sums to it, ids are unique and below the count, records are sorted newest first and capped, the active
        /// count is the length, and a second sync with nothing new changes nothing.
        #[test]
        fn merge_invariants(batches in prop::collection::vec(
            prop::collection::vec((0i32..30, 0i64..50), 0..40), 1..4)
        ) {
            let mut status: Option<WorkloadNetworkPolicyStatus> = None;
            let mut total = 0;
            let mut latest = std::collections::BTreeMap::new();
            for batch in &batches {
                let observations: Vec<_> = batch.iter().map(|&(port, at)| observation(port, at)).collect();
                for &(port, at) in batch {
                    if latest.insert(port, at).is_none() {
                        total += 1;
                    }
                }
                let out = sync_with(status.as_ref(), &observations, None);
                let s = out.status;
                prop_assert_eq!(s.violation_count, total);
                prop_assert!(s.violations.len() <= MAX_VIOLATIONS);
                prop_assert_eq!(s.active_violation_count, s.violations.len() as i64);
                let mut ids: Vec<i64> = s.violations.iter().map(|r| r.id).collect();
                prop_assert!(ids.iter().all(|&id| (0..total).contains(&id)));
                ids.sort();
                ids.dedup();
                prop_assert_eq!(ids.len(), s.violations.len(), "ids are unique");
                prop_assert!(s.violations.windows(2).all(|w| w[0].timestamp.0 >= w[1].timestamp.0));
                // Ports 0..30 are 30 keys: one record per distinct key.
                let distinct: std::collections::BTreeSet<i32> =
                    s.violations.iter().filter_map(|r| r.dst_port).collect();
                prop_assert_eq!(distinct.len(), s.violations.len());
                // All times lie in the kept hours: the history sums to the count.
                let in_history: i64 = s.violation_history.iter().map(|b| b.count).sum();
                prop_assert_eq!(in_history, total);
                let again = sync_with(Some(&s), &[], None);
                prop_assert!(!again.status_changed);
                status = Some(s);
            }
        }
    }
}

#[test]
fn acknowledgement_reasons_are_cut_to_a_bound() {
    let long = "é".repeat(MAX_REASON_CHARS + 10);
    // (reason, kept)
    let cases = [
        ("looked at it".to_string(), "looked at it".to_string()),
        ("x".repeat(MAX_REASON_CHARS), "x".repeat(MAX_REASON_CHARS)),
        (long.clone(), format!("{}…", "é".repeat(MAX_REASON_CHARS))),
        (String::new(), String::new()),
    ];
    for (reason, kept) in cases {
        assert_eq!(cap_reason(&reason), kept, "{:.20}", reason);
    }
    // What a sync writes into the status.
    let first = sync_with(None, &[observation(18081, 0)], None).status;
    let huge = "why ".repeat(60_000);
    let out = sync_with(Some(&first), &[], Some(&annotations(&[(&ack("0"), &huge)])));
    let reason = &out.status.acknowledged_violations[0].reason;
    assert_eq!(
        reason.chars().count(),
        MAX_REASON_CHARS + 1,
        "cut and marked"
    );
}

#[test]
fn text_is_cut_at_a_character_count_the_same_borrowed_or_owned() {
    for (text, max, want) in [
        ("", 3, ""),
        ("abc", 3, "abc"),
        ("abcd", 3, "abc…"),
        ("héllo", 2, "hé…"),
        ("日本語テキスト", 3, "日本語…"),
    ] {
        assert_eq!(cap_text(text, max), want, "{text:?} cut at {max}");
        assert_eq!(
            cap_string(text.to_string(), max),
            want,
            "{text:?} cut at {max}"
        );
    }
}
