//! Where each cluster-wide flow source the controller reads itself (Calico Goldmane) stands, so that
//! a new leader resumes it where the last one's counted evidence ends (docs/behaviour.md §7.5): the
//! source's windows are numbered by their start time and arrive in order; a window's records hand
//! their evidence to the status sync, whose mark says when it is in statuses. A source's cursor is
//! the newest window whose evidence, and every earlier window's, is written, and never its newest
//! window (Goldmane may still be sending it, or was cut off in the middle of it). It is persisted
//! with the evidence claims ([`super::claims_store`], written after the statuses), and a new leader
//! asks the source for the windows after it: the ones the last leader had not written are read
//! again, not lost, and the ones it had written are not counted twice.
//!
//! Bounded: [`SOURCES`] sources, [`WINDOWS_PER_SOURCE`] unsettled windows each (the oldest is
//! forgotten past it, and the cursor may then pass it).

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Sources remembered (one per `--goldmane-address`; there is one).
pub const SOURCES: usize = 16;
/// Windows waiting for their evidence to be written, per source: two hours of 15-s windows, far
/// beyond a status pass (30 s) or a parked policy's retries.
pub const WINDOWS_PER_SOURCE: usize = 480;

/// A source's cursor as persisted.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PersistedCursor {
    /// The source, e.g. `goldmane/goldmane.calico-system.svc:7443`.
    pub source: String,
    /// The start (the source's unix seconds) of the newest window whose evidence, and every earlier
    /// window's, is in statuses.
    pub through: i64,
}

/// Every source's cursor and unsettled windows (see the module docs).
#[derive(Debug, Default)]
pub struct SourceCursors {
    sources: Mutex<BTreeMap<String, Cursor>>,
}

#[derive(Debug, Default)]
struct Cursor {
    through: Option<i64>,
    /// Window start → the evidence mark its records wait for (`None`: nothing to wait for).
    windows: BTreeMap<i64, Option<u64>>,
}

impl SourceCursors {
    /// Window `start` of `source` handed records on whose evidence waits for `mark` (`None`: none
    /// to wait for). A window at or before the cursor is settled already (a backfill sends it again).
    pub fn fed(&self, source: &str, start: i64, mark: Option<u64>) {
        let mut sources = self.sources.lock().expect("cursors lock");
        if !sources.contains_key(source) && sources.len() >= SOURCES {
            return;
        }
        let cursor = sources.entry(source.to_string()).or_default();
        if cursor.through.is_some_and(|through| start <= through) {
            return;
        }
        let waits = cursor.windows.entry(start).or_default();
        *waits = (*waits).max(mark);
        while cursor.windows.len() > WINDOWS_PER_SOURCE {
            cursor.windows.pop_first();
        }
    }

    /// Moves each cursor over the windows whose evidence is written (`written(mark)`), never over a
    /// source's newest window; returns every cursor, to persist.
    pub fn advance(&self, written: impl Fn(u64) -> bool) -> Vec<PersistedCursor> {
        let mut sources = self.sources.lock().expect("cursors lock");
        let mut out = Vec::with_capacity(sources.len());
        for (source, cursor) in sources.iter_mut() {
            while cursor.windows.len() > 1 {
                let Some((&start, &mark)) = cursor.windows.first_key_value() else {
                    break;
                };
                if !mark.is_none_or(&written) {
                    break;
                }
                cursor.windows.pop_first();
                cursor.through = Some(start);
            }
            if let Some(through) = cursor.through {
                out.push(PersistedCursor {
                    source: source.clone(),
                    through,
                });
            }
        }
        out
    }

    /// Takes in the cursors a previous leader persisted; a cursor this process has moved further
    /// already is kept.
    pub fn restore(&self, persisted: Vec<PersistedCursor>) {
        let mut sources = self.sources.lock().expect("cursors lock");
        for p in persisted {
            if !sources.contains_key(&p.source) && sources.len() >= SOURCES {
                continue;
            }
            let cursor = sources.entry(p.source).or_default();
            cursor.through = cursor.through.max(Some(p.through));
            let through = p.through;
            cursor.windows.retain(|start, _| *start > through);
        }
    }

    /// Where `source` stands: the newest window whose evidence, and every earlier one's, is in
    /// statuses (`None`: not known).
    pub fn through(&self, source: &str) -> Option<i64> {
        let sources = self.sources.lock().expect("cursors lock");
        sources.get(source).and_then(|c| c.through)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: &str = "goldmane/g:7443";

    #[test]
    fn a_cursor_stops_at_the_first_unwritten_window_and_before_the_newest() {
        let cursors = SourceCursors::default();
        assert!(cursors.advance(|_| true).is_empty(), "nothing read yet");
        // Windows 1000..1045: 1015 waits for mark 7, the others for nothing or mark 3.
        cursors.fed(G, 1_000, Some(3));
        cursors.fed(G, 1_015, None);
        cursors.fed(G, 1_015, Some(7)); // more of the same window
        cursors.fed(G, 1_030, None);
        cursors.fed(G, 1_045, Some(9));
        let up_to = |m: u64| move |mark: u64| mark < m;
        assert!(cursors.advance(up_to(3)).is_empty(), "1000 not written");
        let at = |through| {
            vec![PersistedCursor {
                source: G.into(),
                through,
            }]
        };
        assert_eq!(cursors.advance(up_to(4)), at(1_000));
        assert_eq!(
            cursors.advance(up_to(8)),
            at(1_030),
            "1015 and the empty 1030"
        );
        assert_eq!(
            cursors.advance(up_to(100)),
            at(1_030),
            "never over the newest window: it may be incomplete"
        );
        // A backfill sends settled windows again: they change nothing.
        cursors.fed(G, 1_015, Some(50));
        cursors.fed(G, 1_060, None);
        assert_eq!(cursors.advance(up_to(10)), at(1_045));
        assert_eq!(cursors.through(G), Some(1_045));
        assert_eq!(cursors.through("goldmane/other"), None);
    }

    #[test]
    fn a_restored_cursor_is_where_a_new_leader_resumes_and_never_moves_back() {
        let cursors = SourceCursors::default();
        cursors.restore(vec![PersistedCursor {
            source: G.into(),
            through: 2_000,
        }]);
        assert_eq!(cursors.through(G), Some(2_000));
        cursors.fed(G, 1_985, Some(1)); // before the cursor: settled
        cursors.fed(G, 2_015, None);
        cursors.fed(G, 2_030, None);
        assert_eq!(cursors.advance(|_| false)[0].through, 2_015);
        cursors.restore(vec![PersistedCursor {
            source: G.into(),
            through: 1_000,
        }]);
        assert_eq!(
            cursors.through(G),
            Some(2_015),
            "an older copy moves nothing back"
        );
    }

    #[test]
    fn bounded_in_sources_and_windows() {
        let cursors = SourceCursors::default();
        for s in 0..SOURCES + 5 {
            cursors.fed(&format!("goldmane/{s}"), 1, None);
            cursors.fed(&format!("goldmane/{s}"), 2, None);
        }
        assert_eq!(cursors.advance(|_| true).len(), SOURCES);
        let cursors = SourceCursors::default();
        for w in 0..WINDOWS_PER_SOURCE as i64 + 10 {
            cursors.fed(G, 100 + w * 15, Some(w as u64));
        }
        let windows = cursors.sources.lock().unwrap()[G].windows.len();
        assert_eq!(windows, WINDOWS_PER_SOURCE);
    }
}
