//! Issue 44 item 3: an agent that sends a known edge once per refresh interval (the default) and an
//! agent that sends it every flush (`--refresh-seconds 0`, and every agent before the refresh) give
//! the controller the same facts: the same violation count under the controller's own counting rule
//! (its [`RepeatFilter`], 60-s window), the same first and last sighting, the same occurrences in all.
//! The records are unchanged, so a controller takes both kinds of agent side by side during a
//! rolling upgrade; this checks it loses nothing by the fewer records.

use network_enforcer_agent::refresh::{COUNTING_WINDOW_MS, Refresher};
use network_enforcer_api::uplink::{FlowRecord, LocalPod};
use network_enforcer_api::{Direction, PolicyMode, Protocol, WorkloadRef};
use network_enforcer_controller::monitor::violations::Observation;
use network_enforcer_controller::monitor::violations::evidence::{REPEAT_WINDOW, RepeatFilter};
use std::time::{Duration, Instant};

/// The agent's flush interval (the default).
const FLUSH_S: u64 = 10;

/// The records one agent sends for an edge seen at `seconds` (sorted), flushing every
/// [`FLUSH_S`] and refreshing every `refresh` (stopping after the last flush).
fn records(seconds: &[u64], refresh: Duration) -> Vec<FlowRecord> {
    let start = Instant::now();
    let mut refresher = Refresher::new(refresh, Duration::from_secs(FLUSH_S));
    let end = seconds.last().copied().unwrap_or(0) + 3 * FLUSH_S;
    let mut sent = Vec::new();
    for flush in (FLUSH_S..=end).step_by(FLUSH_S as usize) {
        let seen: Vec<u64> = seconds
            .iter()
            .copied()
            .filter(|s| *s < flush && *s + FLUSH_S >= flush)
            .collect();
        let flushed = match (seen.first(), seen.last()) {
            (Some(first), Some(last)) => vec![FlowRecord {
                local: Some(LocalPod {
                    uid: "pod".into(),
                    ..LocalPod::default()
                }),
                peer_ip: vec![10, 0, 0, 9],
                port: 8080,
                first_seen_ms: (*first * 1000) as i64,
                last_seen_ms: (*last * 1000) as i64,
                count: seen.len() as u64,
                ..FlowRecord::default()
            }],
            _ => Vec::new(),
        };
        // Flushes run a little early or late (scans, a busy node): up to 0.2 s either way.
        let jitter = Duration::from_millis(flush * 37 % 401);
        let when = start + Duration::from_secs(flush) + jitter - Duration::from_millis(200);
        sent.extend(refresher.take(flushed, when));
    }
    sent.extend(refresher.release());
    sent
}

/// What the controller makes of `records`: occurrences counted under its rule, the first and last
/// sighting, the occurrences in all.
fn judged(records: &[FlowRecord]) -> (usize, i64, i64, u64) {
    let mut filter = RepeatFilter::new(REPEAT_WINDOW);
    let counted = records
        .iter()
        .filter(|r| {
            filter.admit(&Observation {
                timestamp: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::from_millisecond(r.last_seen_ms).unwrap(),
                ),
                source: WorkloadRef::default(),
                dest: WorkloadRef::default(),
                protocol: Protocol::TCP,
                dst_port: Some(8080),
                action: PolicyMode::Monitor,
                direction: Direction::Ingress,
                denying_policy_namespace: "shop".into(),
                denying_policy_name: "web".into(),
            })
        })
        .count();
    (
        counted,
        records.iter().map(|r| r.first_seen_ms).min().unwrap_or(0),
        records.iter().map(|r| r.last_seen_ms).max().unwrap_or(0),
        records.iter().map(|r| r.count).sum(),
    )
}

/// The agent's copy of the controller's counting window is the controller's.
#[test]
fn the_agent_counts_with_the_controllers_window() {
    assert_eq!(
        Duration::from_millis(COUNTING_WINDOW_MS as u64),
        REPEAT_WINDOW
    );
}

#[test]
fn an_agent_that_refreshes_gives_the_controller_the_same_facts_with_fewer_records() {
    let every = |from: u64, to: u64, step: u64| (from..=to).step_by(step as usize);
    // (pattern, sightings)
    let patterns: Vec<(&str, Vec<u64>)> = vec![
        (
            "steady, every second for 10 min",
            every(0, 599, 1).collect(),
        ),
        ("every 7 s for an hour", every(3, 3_600, 7).collect()),
        ("once", vec![42]),
        ("two a minute apart", vec![0, 61]),
        (
            "bursts with gaps",
            every(0, 65, 1)
                .chain(every(200, 230, 5))
                .chain(every(231, 300, 13))
                .chain([900, 959, 960, 1_021])
                .collect(),
        ),
        ("every 29 s", every(5, 1_200, 29).collect()),
        ("every 61 s", every(0, 1_830, 61).collect()),
        // Merging 72 into 95 would have moved the counting point (a review's case).
        ("0, 35, 58, 72, 95, 135", vec![0, 35, 58, 72, 95, 135]),
        ("every 11 s", every(0, 900, 11).collect()),
        ("every 59 s", every(0, 1_200, 59).collect()),
    ];
    let mut steady = None;
    for (pattern, seconds) in patterns {
        let before = records(&seconds, Duration::ZERO);
        let after = records(&seconds, Duration::from_secs(30));
        assert_eq!(judged(&after), judged(&before), "{pattern}");
        assert!(after.len() <= before.len(), "{pattern}");
        eprintln!(
            "{pattern}: {} records with the refresh, {} without",
            after.len(),
            before.len()
        );
        if pattern.starts_with("steady") {
            steady = Some((after.len(), before.len()));
        }
    }
    // A steady edge: well under half the records (a third, and the counted ones).
    let (after, before) = steady.expect("the steady pattern");
    assert!(
        after * 2 < before,
        "{after} records with the refresh, {before} without"
    );
}
