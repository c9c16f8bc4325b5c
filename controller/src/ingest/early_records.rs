//! Records that arrive before their pod (docs/behaviour.md §1.3, "Waiting for the index").
//!
//! An agent learns of its node's pods from the API server, as the controller does, and the two watches
//! do not deliver at the same moment: a controller whose watch lags (a busy API server, a watch that
//! reconnects) can get a new pod's first connections before the pod itself, or before its binding to
//! a node. Refused, those records would be lost: the agent forgets what was acknowledged. So a record
//! whose local pod the index does not know yet, or knows without a node, waits up to the resolution
//! grace (`--resolution-grace-seconds`) and is read again when batches come in (at most every
//! [`RETRY_EVERY_MS`]) and before every flush. Once the index knows its pod the record is taken in as
//! if it had just arrived (a pod on another node is refused then, `not_on_node`); once the grace is
//! over it is refused (`records_rejected_total{reason="unknown_local_pod"}`). Its batch's
//! acknowledgement waits as for an observation that waits for the index, so a controller restart
//! meanwhile loses nothing: the agent sends the batch again.
//!
//! Bounded, because a hostile agent may name pods that will never exist: at most [`MAX_WAITING`]
//! records, [`MAX_WAITING_PER_NODE`] of them from one node, each at most [`MAX_RECORD_BYTES`] encoded.
//! A record past a bound is refused at once, as is every record when the grace is 0.

use crate::cluster::index::Index;
use crate::ingest::flow_record;
use crate::learn::Reporter;
use network_enforcer_api::uplink::FlowRecord;
use prost::Message;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// At most this many records wait for their pods.
pub const MAX_WAITING: usize = 10_000;

/// At most this many of them from one node: one agent naming pods that never come cannot take the
/// room of the others.
pub const MAX_WAITING_PER_NODE: usize = 1_000;

/// A record larger than this (encoded) does not wait: a real one is a few hundred bytes, so the
/// waiting records hold at most about 10 MiB.
pub const MAX_RECORD_BYTES: usize = 1_024;

/// Incoming batches look at the waiting records at most this often (a flush always does).
pub const RETRY_EVERY_MS: i64 = 250;

/// A record waiting for its pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Early {
    /// The node whose stream (or cluster source) sent it: its pod must run there.
    pub node: String,
    pub reporter: Reporter,
    pub record: FlowRecord,
    /// When it arrived, ms since the epoch: it is taken in as of then.
    pub arrived_ms: i64,
    /// When its wait ends.
    pub until_ms: i64,
    /// Whether it counts as violation evidence (not when its batch is a repeat: [`super::claims`]).
    pub counts: bool,
    /// Its batch's claim ([`super::claims::ClaimGate`]).
    pub gate: Option<super::claims::ClaimGate>,
}

/// Why a record cannot wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoWait {
    /// The resolution grace is 0.
    NoGrace,
    /// The record is larger than [`MAX_RECORD_BYTES`].
    TooLarge,
    /// [`MAX_WAITING`] or [`MAX_WAITING_PER_NODE`] records wait already.
    Full,
}

/// What [`EarlyRecords::take_decided`] hands back, to take in or refuse.
#[derive(Debug, Default, PartialEq)]
pub struct Decided {
    /// Records whose pod the index now knows with a node.
    pub placed: Vec<Early>,
    /// Records whose grace is over.
    pub expired: Vec<Early>,
}

/// The records waiting for their pods (see the module docs).
#[derive(Debug, Default)]
pub struct EarlyRecords {
    waiting: Mutex<Waiting>,
    /// Held by whoever takes records out to take them in ([`EarlyRecords::settling`]).
    settling: Mutex<()>,
    /// How many wait, read without the lock by every batch.
    len: AtomicUsize,
    /// When a batch last looked at them, ms since the epoch.
    last_try_ms: AtomicI64,
}

#[derive(Debug, Default)]
struct Waiting {
    records: VecDeque<Early>,
    per_node: HashMap<String, usize>,
}

/// Whether the index knows `record`'s pod and where it runs: the record need not wait any longer.
pub fn placed(record: &FlowRecord, index: &Index) -> bool {
    flow_record::local_pod(record, index).is_some_and(|pod| pod.node.is_some())
}

impl EarlyRecords {
    /// Number of records waiting.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lets `record`, from `node`, wait up to `grace_ms` from `now_ms` for its pod; returns when its
    /// wait ends.
    pub fn hold(
        &self,
        node: &str,
        reporter: Reporter,
        record: &FlowRecord,
        now_ms: i64,
        grace_ms: i64,
    ) -> Result<i64, NoWait> {
        self.hold_as(
            node,
            reporter,
            record,
            now_ms,
            grace_ms,
            super::claims::Counts {
                counts: true,
                gate: None,
            },
        )
    }

    /// [`EarlyRecords::hold`], saying whether the record `counts` as violation evidence, and for
    /// which claim.
    pub fn hold_as(
        &self,
        node: &str,
        reporter: Reporter,
        record: &FlowRecord,
        now_ms: i64,
        grace_ms: i64,
        counts: super::claims::Counts<'_>,
    ) -> Result<i64, NoWait> {
        if grace_ms <= 0 {
            return Err(NoWait::NoGrace);
        }
        if record.encoded_len() > MAX_RECORD_BYTES {
            return Err(NoWait::TooLarge);
        }
        let mut waiting = self.waiting.lock().expect("early records lock");
        let from_node = waiting.per_node.get(node).copied().unwrap_or(0);
        if waiting.records.len() >= MAX_WAITING || from_node >= MAX_WAITING_PER_NODE {
            return Err(NoWait::Full);
        }
        let until_ms = now_ms.saturating_add(grace_ms);
        waiting.per_node.insert(node.to_string(), from_node + 1);
        waiting.records.push_back(Early {
            node: node.to_string(),
            reporter,
            record: record.clone(),
            arrived_ms: now_ms,
            until_ms,
            counts: counts.counts,
            gate: counts.gate.cloned(),
        });
        self.len.store(waiting.records.len(), Ordering::Relaxed);
        Ok(until_ms)
    }

    /// The right to take records out ([`EarlyRecords::take_decided`]) and take them in, held until
    /// they are: a flush that settles must not start writing while another thread has records out
    /// but not merged yet (it would write without them, and acknowledge their batches).
    /// `wait: false` (a batch's look): `None` when someone else settles.
    pub fn settling(&self, wait: bool) -> Option<MutexGuard<'_, ()>> {
        if wait {
            Some(self.settling.lock().expect("early records settling lock"))
        } else {
            self.settling.try_lock().ok()
        }
    }

    /// Whether a batch arriving at `now_ms` should look at the waiting records: some wait and no batch
    /// looked in the last [`RETRY_EVERY_MS`]. Claims the look.
    pub fn due(&self, now_ms: i64) -> bool {
        if self.is_empty() {
            return false;
        }
        let last = self.last_try_ms.load(Ordering::Relaxed);
        now_ms.saturating_sub(last) >= RETRY_EVERY_MS
            && self
                .last_try_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Takes out the records whose pod `index` now knows with a node, and those whose grace is over
    /// at `now_ms`; the others keep waiting, in order.
    pub fn take_decided(&self, index: &Index, now_ms: i64) -> Decided {
        let mut waiting = self.waiting.lock().expect("early records lock");
        let mut decided = Decided::default();
        let mut still = VecDeque::with_capacity(waiting.records.len());
        for early in std::mem::take(&mut waiting.records) {
            if placed(&early.record, index) {
                decided.placed.push(early);
            } else if now_ms >= early.until_ms {
                decided.expired.push(early);
            } else {
                still.push_back(early);
            }
        }
        for early in decided.placed.iter().chain(&decided.expired) {
            if let Some(n) = waiting.per_node.get_mut(&early.node) {
                *n -= 1;
                if *n == 0 {
                    waiting.per_node.remove(&early.node);
                }
            }
        }
        waiting.records = still;
        self.len.store(waiting.records.len(), Ordering::Relaxed);
        decided
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use network_enforcer_api::uplink::LocalPod;

    fn pod(name: &str, node: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "shop", "name": name, "uid": format!("uid-{name}")},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": "Running", "podIP": "10.0.0.7"}
        }))
        .unwrap()
    }

    fn record(name: &str) -> FlowRecord {
        FlowRecord {
            local: Some(LocalPod {
                namespace: "shop".into(),
                name: name.into(),
                uid: String::new(),
            }),
            peer_ip: vec![10, 0, 0, 9],
            port: 8080,
            ..FlowRecord::default()
        }
    }

    fn names(records: &[Early]) -> Vec<&str> {
        records
            .iter()
            .map(|e| e.record.local.as_ref().unwrap().name.as_str())
            .collect()
    }

    #[test]
    fn a_record_waits_until_its_pod_is_known_with_a_node_or_its_grace_is_over() {
        let early = EarlyRecords::default();
        for name in ["web-1", "web-2", "never"] {
            let until = early.hold("node-a", Reporter::Node, &record(name), 1_000, 30_000);
            assert_eq!(until, Ok(31_000));
        }
        let mut index = Index::default();
        // Known, but not bound to a node yet: still waits.
        index.apply_pod(&pod("web-1", None), 2_000);
        assert_eq!(early.take_decided(&index, 2_000), Decided::default());
        assert_eq!(early.len(), 3);
        index.apply_pod(&pod("web-1", Some("node-a")), 3_000);
        // On another node: no longer waits either (it is refused when taken in).
        index.apply_pod(&pod("web-2", Some("node-b")), 3_000);
        let decided = early.take_decided(&index, 3_000);
        assert_eq!(names(&decided.placed), ["web-1", "web-2"]);
        assert!(decided.expired.is_empty());
        assert_eq!(
            decided.placed[0].arrived_ms, 1_000,
            "taken in as of its arrival"
        );
        assert_eq!(early.len(), 1);
        assert!(early.take_decided(&index, 30_999).placed.is_empty());
        let decided = early.take_decided(&index, 31_000);
        assert_eq!(names(&decided.expired), ["never"]);
        assert!(early.is_empty());
    }

    #[test]
    fn nothing_waits_without_a_grace_too_large_or_past_a_bound() {
        let early = EarlyRecords::default();
        let r = record("web-1");
        assert_eq!(
            early.hold("a", Reporter::Node, &r, 0, 0),
            Err(NoWait::NoGrace)
        );
        let mut big = r.clone();
        big.local.as_mut().unwrap().name = "x".repeat(MAX_RECORD_BYTES);
        assert_eq!(
            early.hold("a", Reporter::Node, &big, 0, 1),
            Err(NoWait::TooLarge)
        );
        // One node fills its share; another still has room, until the whole queue is full.
        for _ in 0..MAX_WAITING_PER_NODE {
            assert!(early.hold("a", Reporter::Node, &r, 0, 1).is_ok());
        }
        assert_eq!(early.hold("a", Reporter::Node, &r, 0, 1), Err(NoWait::Full));
        let mut node = 0;
        while early.len() < MAX_WAITING {
            node += 1;
            let name = format!("n{}", node / MAX_WAITING_PER_NODE);
            assert!(early.hold(&name, Reporter::Node, &r, 0, 1).is_ok());
        }
        assert_eq!(early.hold("z", Reporter::Node, &r, 0, 1), Err(NoWait::Full));
        // Decided records give their node its room back.
        let decided = early.take_decided(&Index::default(), 1);
        assert_eq!(decided.expired.len(), MAX_WAITING);
        assert!(early.hold("a", Reporter::Node, &r, 1, 1).is_ok());
    }

    #[test]
    fn one_thread_settles_at_a_time_and_a_batch_does_not_wait_for_it() {
        let early = EarlyRecords::default();
        let held = early.settling(false).expect("nobody settles yet");
        assert!(early.settling(false).is_none(), "a batch's look skips");
        std::thread::scope(|s| {
            let flush = s.spawn(|| early.settling(true).is_some());
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(
                !flush.is_finished(),
                "a flush waits until the records are merged"
            );
            drop(held);
            assert!(flush.join().unwrap());
        });
    }

    #[test]
    fn batches_look_at_most_every_retry_interval_and_only_when_some_wait() {
        let early = EarlyRecords::default();
        assert!(!early.due(1_000), "nothing waits");
        early
            .hold("a", Reporter::Node, &record("web-1"), 1_000, 30_000)
            .unwrap();
        assert!(early.due(1_000));
        assert!(!early.due(1_000 + RETRY_EVERY_MS - 1));
        assert!(early.due(1_000 + RETRY_EVERY_MS));
    }
}
