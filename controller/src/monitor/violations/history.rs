//! `status.violationHistory`: the occurrences `violationCount` counted, per hour of the occurrence's
//! time, over the last [`VIOLATION_HISTORY_HOURS`] hours (docs/behaviour.md §3.7). Kept in the status
//! rather than in memory so that the web view's plot survives a restart or a leader change, and
//! counted where `violationCount` is, so it follows the same counting rule (a resent occurrence adds
//! to neither).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use network_enforcer_api::{VIOLATION_HISTORY_HOURS, ViolationBucket};

const HOUR_SECONDS: i64 = 3600;

/// The start of `at`'s hour, in seconds since the epoch.
fn hour_of(at: &Time) -> i64 {
    at.0.as_second().div_euclid(HOUR_SECONDS) * HOUR_SECONDS
}

/// The first hour the history keeps at `now`.
fn oldest_kept(now: &Time) -> i64 {
    hour_of(now) - (VIOLATION_HISTORY_HOURS as i64 - 1) * HOUR_SECONDS
}

/// Adds one occurrence at `at` to its hour. An occurrence older than the kept hours adds nothing
/// (it still counts in `violationCount`); one later than `now` (a node's clock ahead of the
/// controller's) counts in the current hour, so that a skewed clock cannot fill future hours.
pub fn count(history: &mut Vec<ViolationBucket>, at: &Time, now: &Time) {
    let hour = hour_of(at).min(hour_of(now));
    if hour < oldest_kept(now) {
        return;
    }
    match history.binary_search_by_key(&hour, |b| b.start.0.as_second()) {
        Ok(i) => history[i].count = history[i].count.saturating_add(1),
        Err(i) => {
            let Ok(start) = Timestamp::from_second(hour) else {
                return;
            };
            history.insert(
                i,
                ViolationBucket {
                    start: Time(start),
                    count: 1,
                },
            );
        }
    }
}

/// Puts a history read from a status in order and drops the hours that fell out of the window: what
/// [`count`] expects. An hour after `now`'s was written by a leader whose clock ran ahead: it joins
/// the current hour, as [`count`] does with such an occurrence, rather than being lost. The status is
/// written only by the controller, but anyone allowed to patch it could have written starts off the
/// hour, out of order, duplicates, or more than the schema's bound on a cluster that does not
/// enforce it.
pub fn settle(history: &mut Vec<ViolationBucket>, now: &Time) {
    let oldest = oldest_kept(now);
    let latest = hour_of(now);
    history.retain_mut(|b| {
        let hour = hour_of(&b.start).min(latest);
        if hour != b.start.0.as_second() {
            match Timestamp::from_second(hour) {
                Ok(start) => b.start = Time(start),
                Err(_) => return false,
            }
        }
        hour >= oldest && b.count > 0
    });
    history.sort_by_key(|b| b.start.0.as_second());
    history.dedup_by(|later, earlier| {
        let same = later.start.0.as_second() == earlier.start.0.as_second();
        if same {
            earlier.count = earlier.count.saturating_add(later.count);
        }
        same
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Time {
        Time(text.parse().unwrap())
    }

    fn bucket(start: &str, count: i64) -> ViolationBucket {
        ViolationBucket {
            start: at(start),
            count,
        }
    }

    #[test]
    fn occurrences_count_in_the_hour_of_their_time() {
        let now = at("2026-12-06T12:30:00Z");
        // (case, occurrence times, expected buckets (hour, count))
        type Case<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, i64)]);
        let cases: &[Case] = &[
            ("none", &[], &[]),
            (
                "one hour, twice",
                &["2026-12-06T12:00:00Z", "2026-12-06T12:29:59Z"],
                &[("2026-12-06T12:00:00Z", 2)],
            ),
            (
                "hours kept in order whatever the arrival order",
                &[
                    "2026-12-06T11:59:59Z",
                    "2026-12-05T13:10:00Z",
                    "2026-12-06T11:00:00Z",
                ],
                &[("2026-12-05T13:00:00Z", 1), ("2026-12-06T11:00:00Z", 2)],
            ),
            (
                "the oldest kept hour, and one before it",
                &["2026-12-04T13:00:00Z", "2026-12-04T12:59:59Z"],
                &[("2026-12-04T13:00:00Z", 1)],
            ),
            (
                "a clock ahead counts now",
                &["2026-12-06T15:00:00Z"],
                &[("2026-12-06T12:00:00Z", 1)],
            ),
        ];
        for (name, occurrences, want) in cases {
            let mut history = Vec::new();
            for o in *occurrences {
                count(&mut history, &at(o), &now);
            }
            let want: Vec<_> = want.iter().map(|(s, c)| bucket(s, *c)).collect();
            assert_eq!(history, want, "{name}");
        }
    }

    #[test]
    fn a_history_from_a_status_is_settled_into_the_window() {
        let now = at("2026-12-06T12:30:00Z");
        let mut history = vec![
            bucket("2026-12-06T12:00:00Z", 1),
            bucket("2026-12-04T12:00:00Z", 5), // fell out of the window
            bucket("2026-12-06T10:00:00Z", 2),
            bucket("2026-12-06T10:00:00Z", 3), // a duplicate hour
            bucket("2026-12-06T13:00:00Z", 4), // a leader whose clock ran ahead
            bucket("2026-12-06T09:00:00Z", 0), // empty
            bucket("2026-12-06T08:30:00Z", 6), // off the hour
        ];
        settle(&mut history, &now);
        assert_eq!(
            history,
            vec![
                bucket("2026-12-06T08:00:00Z", 6),
                bucket("2026-12-06T10:00:00Z", 5),
                bucket("2026-12-06T12:00:00Z", 5),
            ]
        );
        // At most one bucket per kept hour: the schema's bound holds.
        let mut full = Vec::new();
        for h in 0..100 {
            let t = Time(Timestamp::from_second(now.0.as_second() - h * HOUR_SECONDS).unwrap());
            count(&mut full, &t, &now);
        }
        settle(&mut full, &now);
        assert_eq!(full.len(), VIOLATION_HISTORY_HOURS);
    }
}
