//! Where the Hubble client resumes: after a reconnect ([`Resume`], in memory) and after the agent
//! restarts ([`ResumeFile`], the newest resume point whose records the controller acknowledged,
//! saved in `--hubble-state-file`). Hubble keeps recent flows in a ring buffer and streams them again
//! from the `since` a request names, so a restart neither loses the flows of its gap (as far as the
//! buffer reaches) nor takes twice what the controller acknowledged (docs/flow-sources.md, "Resume").

use crate::uplink::ReceiptWatch;
use network_enforcer_api::hubble::Flow;
use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;

/// Flow ids at the resume time kept in the file: flows that share one nanosecond are few; past it a
/// flow at that time may be taken again after a restart.
pub const MAX_SAVED_IDS: usize = 1024;
/// Resume points waiting for their records' acknowledgement; past it the newest one is moved on
/// and waits for both (as the ztunnel reader's checkpoints do).
pub const MAX_PENDING: usize = 64;

/// Where the resume point is: the newest flow time taken, and the flows taken at exactly that time
/// (Hubble's `since` is inclusive, so they come again after a reconnect). Pure.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resume {
    last: Option<prost_types::Timestamp>,
    at_last: HashSet<String>,
}

/// A flow's identity for [`Resume`]: its uuid, or (older servers) its content.
fn flow_id(flow: &Flow) -> String {
    if flow.uuid.is_empty() {
        format!("{flow:?}")
    } else {
        flow.uuid.clone()
    }
}

impl Resume {
    /// The `since` of the next request (`None` before the first flow: start with live flows).
    pub fn since(&self) -> Option<prost_types::Timestamp> {
        self.last
    }

    /// Whether `flow` is new (not taken before); records it as taken.
    pub fn take(&mut self, flow: &Flow) -> bool {
        let Some(time) = flow.time else {
            return true;
        };
        let key = (time.seconds, time.nanos);
        match self.last.map(|l| (l.seconds, l.nanos)) {
            Some(last) if key < last => false,
            Some(last) if key == last => self.at_last.insert(flow_id(flow)),
            _ => {
                self.last = Some(time);
                self.at_last.clear();
                self.at_last.insert(flow_id(flow));
                true
            }
        }
    }
}

/// [`Resume`] as saved: the time, and the uuids taken at it (content ids of servers without uuids
/// are long and left out).
#[derive(Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Saved {
    seconds: i64,
    nanos: i32,
    at_last: Vec<String>,
}

impl Saved {
    fn of(resume: &Resume) -> Option<Self> {
        let last = resume.last?;
        let mut at_last: Vec<String> = resume
            .at_last
            .iter()
            .filter(|id| id.len() <= 64)
            .cloned()
            .collect();
        at_last.sort();
        at_last.truncate(MAX_SAVED_IDS);
        Some(Saved {
            seconds: last.seconds,
            nanos: last.nanos,
            at_last,
        })
    }

    fn resume(self) -> Resume {
        Resume {
            last: Some(prost_types::Timestamp {
                seconds: self.seconds,
                nanos: self.nanos,
            }),
            at_last: self.at_last.into_iter().take(MAX_SAVED_IDS).collect(),
        }
    }
}

/// The resume points reached, each waiting for the acknowledgement of the records taken up to it,
/// and the file the newest acknowledged one is saved in (see the module docs).
#[derive(Debug)]
pub struct ResumeFile {
    path: Option<PathBuf>,
    pending: VecDeque<(Resume, Vec<ReceiptWatch>)>,
    saved: Option<Resume>,
    warned: bool,
}

impl ResumeFile {
    /// The file at `path` (`None`: nothing kept) and the resume point it holds: where a restarted
    /// agent resumes (`Resume::default()`, live flows, when there is none, it cannot be read, or it
    /// lies more than a minute after `now_s`: the node's clock went back, and such a `since` would
    /// hold back every flow until the clock caught up).
    pub fn open(path: Option<PathBuf>, now_s: i64) -> (Self, Resume) {
        let read = path.as_ref().and_then(|p| match std::fs::read(p) {
            Ok(bytes) => match serde_json::from_slice::<Saved>(&bytes) {
                Ok(saved) if saved.seconds > now_s.saturating_add(60) => {
                    tracing::warn!(file = %p.display(), saved = saved.seconds, now = now_s,
                        "the saved Hubble resume point is in the future (the clock went back): starting with live flows");
                    None
                }
                Ok(saved) => Some(saved.resume()),
                Err(error) => {
                    tracing::warn!(file = %p.display(), %error,
                        "the saved Hubble resume point is damaged: starting with live flows");
                    None
                }
            },
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => {
                tracing::warn!(file = %p.display(), %error,
                    "cannot read the saved Hubble resume point: starting with live flows");
                None
            }
        });
        let file = ResumeFile {
            path,
            pending: VecDeque::new(),
            saved: read.clone(),
            warned: false,
        };
        (file, read.unwrap_or_default())
    }

    /// The client handed the records taken up to `resume` to the flush, with the receipt `watch`
    /// watches (`None`: no records since the last point, which then only moves on: nothing was
    /// taken in between that could wait for anything).
    pub fn reached(&mut self, resume: &Resume, watch: Option<ReceiptWatch>) {
        if watch.is_none() {
            if let Some((newest, _)) = self.pending.back_mut() {
                *newest = resume.clone();
                return;
            }
        }
        if self.pending.len() >= MAX_PENDING {
            if let Some((newest, watches)) = self.pending.back_mut() {
                *newest = resume.clone();
                watches.extend(watch);
                return;
            }
        }
        self.pending
            .push_back((resume.clone(), watch.into_iter().collect()));
    }

    /// Saves the newest resume point whose records, and every earlier point's, are acknowledged (or
    /// dropped and counted by the uplink); an unchanged point is not written again.
    pub fn save_settled(&mut self) {
        let mut reached = None;
        for (_, watches) in &mut self.pending {
            watches.retain(|w| !w.settled());
        }
        while self.pending.front().is_some_and(|(_, w)| w.is_empty()) {
            reached = self.pending.pop_front().map(|(resume, _)| resume);
        }
        let (Some(resume), Some(path)) = (reached, &self.path) else {
            return;
        };
        if self.saved.as_ref() == Some(&resume) {
            return;
        }
        let Some(saved) = Saved::of(&resume) else {
            return;
        };
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = path.with_extension("tmp");
            std::fs::write(
                &tmp,
                serde_json::to_vec(&saved).map_err(std::io::Error::other)?,
            )?;
            std::fs::rename(&tmp, path)
        };
        match write() {
            Ok(()) => self.saved = Some(resume),
            Err(error) if !self.warned => {
                self.warned = true;
                tracing::warn!(file = %path.display(), %error,
                    "cannot save the Hubble resume point; after a restart the agent starts with live flows");
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn flow(uuid: &str, seconds: i64) -> Flow {
        Flow {
            uuid: uuid.into(),
            time: Some(prost_types::Timestamp { seconds, nanos: 5 }),
            ..Flow::default()
        }
    }

    #[test]
    fn only_acknowledged_resume_points_are_saved_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/hubble-resume.json");
        let (mut file, start) = ResumeFile::open(Some(path.clone()), NOW);
        assert_eq!(start, Resume::default(), "nothing saved: live");

        let mut resume = Resume::default();
        assert!(resume.take(&flow("a", 10)));
        let (first, first_watch) = crate::uplink::receipt();
        file.reached(&resume, Some(first_watch));
        assert!(resume.take(&flow("b", 11)) && resume.take(&flow("c", 11)));
        let (second, second_watch) = crate::uplink::receipt();
        file.reached(&resume, Some(second_watch));
        file.save_settled();
        assert!(!path.exists(), "nothing acknowledged");
        // The later batch acknowledged first: still nothing (the earlier one may be resent).
        second.settle();
        file.save_settled();
        assert!(!path.exists());
        first.settle();
        file.save_settled();
        assert_eq!(
            ResumeFile::open(Some(path.clone()), 10 - 61).1,
            Resume::default(),
            "saved after now: the clock went back"
        );
        let (_, restarted) = ResumeFile::open(Some(path.clone()), NOW);
        assert_eq!(restarted, resume);
        let mut restarted = restarted;
        assert!(!restarted.take(&flow("c", 11)), "taken before the restart");
        assert!(restarted.take(&flow("d", 11)));
        assert!(!restarted.take(&flow("e", 10)));

        std::fs::write(&path, b"{not json").unwrap();
        assert_eq!(ResumeFile::open(Some(path), NOW).1, Resume::default());
        assert_eq!(ResumeFile::open(None, NOW).1, Resume::default());
    }

    #[test]
    fn a_point_without_records_moves_the_newest_on() {
        let (mut file, _) = ResumeFile::open(None, NOW);
        let mut resume = Resume::default();
        resume.take(&flow("a", 10));
        let (_receipt, watch) = crate::uplink::receipt();
        file.reached(&resume, Some(watch));
        for s in 11..200 {
            resume.take(&flow("x", s));
            file.reached(&resume, None);
        }
        assert_eq!(file.pending.len(), 1, "no point per empty hand-over");
        assert_eq!(file.pending[0].0, resume);
    }

    #[test]
    fn pending_points_are_bounded() {
        let (mut file, _) = ResumeFile::open(None, NOW);
        let mut resume = Resume::default();
        let mut receipts = Vec::new();
        for s in 0..(MAX_PENDING as i64 + 10) {
            resume.take(&flow("x", s));
            let (receipt, watch) = crate::uplink::receipt();
            receipts.push(receipt);
            file.reached(&resume, Some(watch));
        }
        assert_eq!(file.pending.len(), MAX_PENDING);
        assert_eq!(
            file.pending.back().unwrap().1.len(),
            11,
            "the newest waits for all merged"
        );
    }
}
