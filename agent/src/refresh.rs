//! What the controller already holds (docs/behaviour.md §7.2): an eBPF edge's first record goes up
//! with the flush that found it; after that the agent sends the edge at most once per refresh
//! interval (`--refresh-seconds`, default 30), the occurrences in between merged into that one record
//! (first seen, last seen, count). A steady edge then costs the controller one record per interval
//! instead of one per flush (three times fewer at the default 10 s flushes).
//!
//! Nothing a consumer needs is lost. Learning needs an edge once. Violations: the controller counts
//! an occurrence when its time is at least [`COUNTING_WINDOW_MS`] from the last one it counted
//! (§3.6); a merged record carries its latest occurrence, which would move that point later, so the
//! agent applies the same rule per edge and sends at once a record the controller would count, with
//! what it held: the controller counts the occurrences it would have counted with a record per
//! flush. Rule usage is written in 5-minute steps; the protect gate keeps first and last seen.
//!
//! Pure bookkeeping over plain records and a clock passed in; the event loop holds one.

use network_enforcer_api::uplink::FlowRecord;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

/// The controller's counting window (docs/behaviour.md §3.6: its `REPEAT_WINDOW`, which a test in
/// `tests/` checks this equals).
pub const COUNTING_WINDOW_MS: i64 = 60_000;

/// The longest refresh interval: what the controller knows of a steady edge is at most this old
/// (plus a flush).
pub const MAX_REFRESH: Duration = Duration::from_secs(30);

/// Edges remembered at most; past that a new edge is sent every flush, as without a refresh (and
/// counted), rather than forgetting what is held.
pub const MAX_EDGES: usize = 100_000;

/// What makes two records the same edge (everything but the times and the count), remembered as
/// two keyed hashes (SipHash, per-process random keys): 16 bytes per edge instead of copies of its
/// strings, so that a pod spraying thousands of edges costs little memory. Two edges sharing a key
/// (odds of about n²/2⁶⁵ for n edges, at the least) would be refreshed as one.
type Key = (u64, u64);

/// The hashers of [`Key`].
#[derive(Debug, Default)]
struct Keys(RandomState, RandomState);

impl Keys {
    fn of(&self, r: &FlowRecord) -> Key {
        let fields = (
            r.local.as_ref().map(|l| l.uid.as_str()),
            &r.peer_ip,
            r.port,
            (r.protocol, r.direction, r.outcome, r.source),
            (&r.policy, r.dry_run, &r.peer_name),
        );
        (self.0.hash_one(fields), self.1.hash_one(fields))
    }
}

/// One edge sent before: when, the time of the occurrence the controller last counted (its rule
/// applied to what this edge sent), and what was seen of it since (boxed: most edges hold nothing).
#[derive(Debug)]
struct Sent {
    at: Instant,
    counted_ms: i64,
    /// When the record of `counted_ms` went up.
    counted_at: Instant,
    held: Option<Box<FlowRecord>>,
}

impl Sent {
    /// `record` with what is held merged in, to go up now.
    fn with_held(&mut self, record: FlowRecord) -> FlowRecord {
        match self.held.take() {
            Some(mut held) => {
                merge(&mut held, &record);
                *held
            }
            None => record,
        }
    }
}

/// The refresh interval.
#[derive(Debug, Clone, Copy)]
struct Interval {
    every: Duration,
    /// Half the flush interval: an edge is due at the flush nearest its interval, whatever the
    /// jitter of the flushes' times.
    slack: Duration,
}

impl Interval {
    /// Whether an edge last sent at `at` is due at `now`.
    fn due(self, at: Instant, now: Instant) -> bool {
        now.saturating_duration_since(at) + self.slack >= self.every
    }
}

/// The edges sent within the refresh interval (see the module docs).
#[derive(Debug)]
pub struct Refresher {
    interval: Interval,
    keys: Keys,
    edges: HashMap<Key, Sent>,
    /// Records merged into a held one instead of going up (cumulative).
    pub held_total: u64,
    /// Records sent at once because [`MAX_EDGES`] were remembered (cumulative).
    pub overflowed: u64,
}

impl Refresher {
    /// A refresh every `every` (capped at [`MAX_REFRESH`]) for flushes every `flush_every`; zero
    /// sends every record at once.
    pub fn new(every: Duration, flush_every: Duration) -> Self {
        Refresher {
            interval: Interval {
                every: every.min(MAX_REFRESH),
                slack: flush_every / 2,
            },
            keys: Keys::default(),
            edges: HashMap::new(),
            held_total: 0,
            overflowed: 0,
        }
    }

    /// What of `records` (one flush's, at `now`) goes up now: each new edge's record, each record
    /// the controller would count, and each edge whose refresh is due, with what was held of it;
    /// the other records are held. Edges held since an earlier flush whose refresh is due go up
    /// too, even if not seen in this one.
    pub fn take(&mut self, records: Vec<FlowRecord>, now: Instant) -> Vec<FlowRecord> {
        if self.interval.every.is_zero() {
            return records;
        }
        // In place: a spray's flush holds tens of thousands of records, and a second vector growing
        // beside the first doubled the agent's memory for it (the hostile-workload test's bound).
        let mut out: Vec<FlowRecord> = records
            .into_iter()
            .filter_map(|record| self.one(record, now))
            .collect();
        // Held edges that went quiet: their occurrences go up when due. An edge with nothing held
        // is forgotten once due and a counting window after its counted occurrence went up: seen
        // again, it goes up at once and the controller counts it, as it would have.
        let interval = self.interval;
        let window = Duration::from_millis(COUNTING_WINDOW_MS.unsigned_abs());
        self.edges.retain(|_, sent| {
            if interval.due(sent.at, now) {
                if let Some(held) = sent.held.take() {
                    out.push(*held);
                    sent.at = now;
                    return true;
                }
                return now.saturating_duration_since(sent.counted_at) < window;
            }
            true
        });
        out
    }

    /// `record` if it goes up now (with what was held of its edge), or `None` if it is held.
    fn one(&mut self, record: FlowRecord, now: Instant) -> Option<FlowRecord> {
        let key = self.keys.of(&record);
        let full = self.edges.len() >= MAX_EDGES;
        match self.edges.get_mut(&key) {
            Some(sent) => {
                let due = self.interval.due(sent.at, now);
                let counts = record.last_seen_ms >= sent.counted_ms + COUNTING_WINDOW_MS;
                if counts || due {
                    let record = sent.with_held(record);
                    if counts {
                        sent.counted_ms = record.last_seen_ms;
                        sent.counted_at = now;
                    }
                    sent.at = now;
                    Some(record)
                } else {
                    self.held_total += 1;
                    match &mut sent.held {
                        Some(held) => merge(held, &record),
                        None => sent.held = Some(Box::new(record)),
                    }
                    None
                }
            }
            None if full => {
                self.overflowed += 1;
                Some(record)
            }
            None => {
                self.edges.insert(
                    key,
                    Sent {
                        at: now,
                        counted_ms: record.last_seen_ms,
                        counted_at: now,
                        held: None,
                    },
                );
                Some(record)
            }
        }
    }

    /// Everything held, for the last flush before the agent stops.
    pub fn release(&mut self) -> Vec<FlowRecord> {
        self.edges
            .drain()
            .filter_map(|(_, sent)| sent.held.map(|held| *held))
            .collect()
    }

    /// Edges remembered now.
    pub fn remembered(&self) -> usize {
        self.edges.len()
    }

    /// Records held now.
    pub fn held(&self) -> usize {
        self.edges.values().filter(|s| s.held.is_some()).count()
    }
}

/// `into` with `other`'s occurrences: the earliest first, the latest last, the counts added.
fn merge(into: &mut FlowRecord, other: &FlowRecord) {
    into.first_seen_ms = into.first_seen_ms.min(other.first_seen_ms);
    into.last_seen_ms = into.last_seen_ms.max(other.last_seen_ms);
    into.count = into.count.saturating_add(other.count);
}

#[cfg(test)]
mod tests {
    use super::*;
    use network_enforcer_api::uplink::LocalPod;

    /// A record of pod `uid`'s edge to port `port`, seen at `at_ms`.
    fn record(uid: &str, port: u32, at_ms: i64) -> FlowRecord {
        FlowRecord {
            local: Some(LocalPod {
                uid: uid.into(),
                ..LocalPod::default()
            }),
            peer_ip: vec![10, 0, 0, 9],
            port,
            first_seen_ms: at_ms,
            last_seen_ms: at_ms,
            count: 1,
            ..FlowRecord::default()
        }
    }

    /// A record as the tests compare it: port, first seen, last seen, count.
    type Seen = (u32, i64, i64, u64);

    fn sent(records: &[FlowRecord]) -> Vec<Seen> {
        let mut out: Vec<_> = records
            .iter()
            .map(|r| (r.port, r.first_seen_ms, r.last_seen_ms, r.count))
            .collect();
        out.sort();
        out
    }

    /// A steady edge flushed every 10 s goes up once per 30 s with what was seen between; a new
    /// edge at once; an edge that went quiet with occurrences held goes up when due; a quiet edge
    /// is forgotten and sent at once when seen again; the last flush releases what is held.
    #[test]
    fn a_steady_edge_goes_up_once_per_interval_with_its_occurrences() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut refresh = Refresher::new(Duration::from_secs(30), Duration::from_secs(10));
        // (second, records flushed then, records sent then)
        let steps: [(u64, Vec<FlowRecord>, Vec<Seen>); 9] = [
            (0, vec![record("a", 80, 0)], vec![(80, 0, 0, 1)]),
            (10, vec![record("a", 80, 10)], vec![]),
            // A new edge of the same pod: at once.
            (
                20,
                vec![record("a", 80, 20), record("a", 443, 20)],
                vec![(443, 20, 20, 1)],
            ),
            // Due: the two held occurrences and this one, as one record.
            (30, vec![record("a", 80, 30)], vec![(80, 10, 30, 3)]),
            (40, vec![record("a", 80, 40)], vec![]),
            // 443 went quiet after one record: nothing held, nothing sent; 80 quiet since 40.
            (50, vec![], vec![]),
            // 80's held occurrence is due though 80 is quiet.
            (60, vec![], vec![(80, 40, 40, 1)]),
            // 443, quiet for longer than an interval with nothing held: due, sent at once.
            (80, vec![record("a", 443, 80)], vec![(443, 80, 80, 1)]),
            (85, vec![record("a", 443, 85)], vec![]),
        ];
        for (second, records, expected) in steps {
            let out = refresh.take(records, at(second));
            assert_eq!(sent(&out), expected, "at {second} s");
        }
        assert_eq!(refresh.held(), 1);
        assert_eq!(sent(&refresh.release()), [(443, 85, 85, 1)]);
        assert_eq!(refresh.held(), 0);
        assert_eq!(refresh.held_total, 4);
    }

    /// A flush's records are filtered in the vector they came in: a spray's flush is tens of
    /// thousands of records, and a second vector beside it doubled the agent's peak memory (the
    /// hostile-workload cluster test failed its bound).
    #[test]
    fn a_flush_is_filtered_in_place() {
        let now = Instant::now();
        let mut refresh = Refresher::new(Duration::from_secs(30), Duration::from_secs(10));
        let records: Vec<FlowRecord> = (0..1000).map(|p| record("a", p, 0)).collect();
        let (at, capacity) = (records.as_ptr(), records.capacity());
        let out = refresh.take(records, now);
        assert_eq!(out.len(), 1000);
        assert_eq!((out.as_ptr(), out.capacity()), (at, capacity));
    }

    /// Zero refreshes nothing: every record goes up (the behaviour before the refresh); an
    /// interval over [`MAX_REFRESH`] is capped; past [`MAX_EDGES`] new edges go up every flush.
    #[test]
    fn off_capped_and_bounded() {
        let now = Instant::now();
        let flush = Duration::from_secs(10);
        let mut off = Refresher::new(Duration::ZERO, flush);
        for _ in 0..3 {
            assert_eq!(off.take(vec![record("a", 80, 0)], now).len(), 1);
        }
        assert_eq!(
            Refresher::new(Duration::from_secs(300), flush)
                .interval
                .every,
            MAX_REFRESH
        );
        let mut full = Refresher::new(Duration::from_secs(30), flush);
        let many: Vec<FlowRecord> = (0..MAX_EDGES as u32 + 2)
            .map(|p| record("a", p, 0))
            .collect();
        assert_eq!(full.take(many, now).len(), MAX_EDGES + 2);
        assert_eq!(full.overflowed, 2);
        let again: Vec<FlowRecord> = (0..MAX_EDGES as u32 + 2)
            .map(|p| record("a", p, 1))
            .collect();
        assert_eq!(full.take(again, now).len(), 2, "remembered ones are held");
    }

    /// A record the controller would count (a window after the last one it counted, on the
    /// record's own clock) goes up at once with what was held, whatever the refresh; flushes a
    /// little early or late do not move an edge to the next one; an edge with nothing held is
    /// forgotten once due and a window after its counted occurrence went up.
    #[test]
    fn what_the_controller_would_count_goes_up_at_once() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut refresh = Refresher::new(Duration::from_secs(30), Duration::from_secs(10));
        let sent = |r: &mut Refresher, record_ms: i64, now_ms: u64| {
            r.take(vec![record("a", 80, record_ms)], at(now_ms))
                .iter()
                .map(|r| (r.first_seen_ms, r.last_seen_ms, r.count))
                .collect::<Vec<_>>()
        };
        assert_eq!(sent(&mut refresh, 0, 0), [(0, 0, 1)]);
        assert_eq!(sent(&mut refresh, 10_000, 10_000), []);
        // 60 s after the counted occurrence on the record's clock (the agent's flushes ran late).
        assert_eq!(sent(&mut refresh, 60_000, 20_000), [(10_000, 60_000, 2)]);
        assert_eq!(sent(&mut refresh, 70_000, 30_000), []);
        // Due a little early (a flush 29.9 s after the last send): not put off to the next.
        assert_eq!(sent(&mut refresh, 80_000, 49_900), [(70_000, 80_000, 2)]);
        assert_eq!(refresh.remembered(), 1);
        // Quiet: kept until due and a window after the counted occurrence went up (at 20 s).
        refresh.take(vec![], at(79_000));
        assert_eq!(refresh.remembered(), 1);
        refresh.take(vec![], at(80_000));
        assert_eq!(refresh.remembered(), 0);
    }
}
